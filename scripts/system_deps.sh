#!/usr/bin/env bash
# Installs the system packages MiniServe needs when they are missing (Debian/Ubuntu, as root):
# redis-server for the broker and the tests, chromium for the monitor page's browser test,
# a C compiler for the q8 kernel (engine/quant/native/q8.c, built once per machine).
set -euo pipefail
missing=()
command -v redis-server >/dev/null 2>&1 || missing+=(redis-server)
command -v chromium >/dev/null 2>&1 || missing+=(chromium)
command -v cc >/dev/null 2>&1 || missing+=(gcc libc6-dev)
[ ${#missing[@]} -eq 0 ] && exit 0
SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
echo "installing system packages: ${missing[*]}"
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
