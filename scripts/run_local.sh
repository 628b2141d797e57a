#!/usr/bin/env bash
# Serves MiniServe locally: a redis-server of its own (unless MINISERVE_REDIS_URL is set),
# a Celery worker and the web server, under honcho (Procfile).
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p var/redis
if [ -z "${MINISERVE_REDIS_URL:-}" ]; then
  port="${MINISERVE_LOCAL_REDIS_PORT:-6379}"
  if ! redis-cli -p "$port" ping >/dev/null 2>&1; then
    # appendonly: queued jobs survive a Redis restart (see README, Reliability).
    # noeviction under a memory cap: a full Redis refuses writes (the web answers 503
    # store_full) instead of evicting jobs, files or queue messages; per-key quotas keep one
    # client from filling it (docs/deployment.md, "Redis memory").
    redis-server --port "$port" --bind 127.0.0.1 --dir var/redis --appendonly yes --daemonize yes \
      --maxmemory "${MINISERVE_LOCAL_REDIS_MAXMEMORY:-2gb}" --maxmemory-policy noeviction --logfile redis.log
  fi
  export MINISERVE_REDIS_URL="redis://127.0.0.1:${port}/0"
fi
host="${MINISERVE_HOST:-127.0.0.1}"; webport="${MINISERVE_PORT:-8000}"
cat <<MSG
MiniServe is starting (Ctrl-C stops it):
  API docs (Swagger UI)  http://${host}:${webport}/docs
  Monitor page           http://${host}:${webport}/monitor
  Health                 http://${host}:${webport}/healthz
  Redis                  ${MINISERVE_REDIS_URL}
MSG
exec .venv/bin/honcho start -f Procfile
