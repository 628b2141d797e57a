#!/usr/bin/env bash
# Installs docker-compose v1 into .venv-compose, so the tests can check docker-compose.yml
# with `docker-compose config` on machines where Docker does not run (CI, this dev box).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=.venv-compose
STAMP=$VENV/.installed
if [ -f "$STAMP" ] && [ "$STAMP" -nt requirements-compose.txt ]; then exit 0; fi
python3 -m venv "$VENV"
"$VENV/bin/pip" install -q -r requirements-compose.txt
"$VENV/bin/pip" install -q --no-deps docker-compose==1.29.2
"$VENV/bin/docker-compose" version >/dev/null
touch "$STAMP"
