#!/usr/bin/env bash
# The whole test suite, fast unit tests and the bounded real-model ("slow") tests alike.
# Integration tests start their own redis-server and Celery worker on free ports.
set -euo pipefail
cd "$(dirname "$0")/.."
export MINISERVE_JSON_LOGS=true
.venv/bin/python -m engine.prepare_default --model all
exec .venv/bin/python -m pytest -q -ra "$@"
