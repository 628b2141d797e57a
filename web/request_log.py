"""One JSON log event per request: method, path, status, latency, job id. Never bodies."""
from __future__ import annotations

import logging
import time

from flask import Flask, Response, g, request

from core.logs import log_event

logger = logging.getLogger("miniserve.web.http")


def install_request_log(app: Flask) -> None:
    @app.before_request
    def _start_clock() -> None:
        g.started = time.perf_counter()

    @app.after_request
    def _log(response: Response) -> Response:
        started = g.get("started")
        latency_ms = round((time.perf_counter() - started) * 1000, 2) if started else None
        log_event(logger, "http_request", method=request.method, path=request.path,
                  status=response.status_code, latency_ms=latency_ms, job_id=g.get("job_id"),
                  streamed=response.is_streamed)
        return response
