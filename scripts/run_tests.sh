#!/usr/bin/env bash
# The whole test suite, fast unit tests and the bounded real-model ("slow") tests alike.
# Integration tests start their own redis-server and Celery worker on free ports.
#
#   scripts/run_tests.sh [--as avx2|avx512-nobf16|portable] [pytest arguments]
#
# --as runs the tests as another CPU would: torch's kernels (ATEN_CPU_CAPABILITY), oneDNN's
# (ONEDNN_MAX_CPU_ISA) and our C kernels' build (MINISERVE_TEST_MARCH, tests/conftest.py)
# capped at that instruction set. The machine must have it (an AVX-512 CPU runs all three).
set -euo pipefail
cd "$(dirname "$0")/.."
export MINISERVE_JSON_LOGS=true
if [[ "${1:-}" == "--as" ]]; then
  case "${2:-}" in
    avx2) export ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 MINISERVE_TEST_MARCH=x86-64-v3 ;;
    avx512-nobf16) export ATEN_CPU_CAPABILITY=avx512 ONEDNN_MAX_CPU_ISA=AVX512_CORE_VNNI \
                          MINISERVE_TEST_MARCH=icelake-server ;;
    portable) export ATEN_CPU_CAPABILITY=default ONEDNN_MAX_CPU_ISA=SSE41 MINISERVE_TEST_MARCH=x86-64 ;;
    *) echo "--as takes avx2, avx512-nobf16 or portable" >&2; exit 2 ;;
  esac
  shift 2
fi
.venv/bin/python -m engine.prepare_default --model all
# One engine thread per test process (the workers the tests start use one too): two pytest
# processes with two OpenMP threads each oversubscribe two cores, and a team whose thread is
# descheduled spins at every barrier (three real-model test files: 108 s at two threads, 39 s
# at one). Set MINISERVE_THREADS to override.
export MINISERVE_THREADS="${MINISERVE_THREADS:-1}"
# Two processes, one per core; a test file stays in one process, so its module-scoped models
# and servers are built once.
exec .venv/bin/python -m pytest -q -ra -n 2 --dist loadfile "$@"
