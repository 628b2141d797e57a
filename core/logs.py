"""Structured logs: one JSON object per event, with ids, latencies and counts.

Callers log *events*, never prompt or answer text: ``log_event(logger, "job_done",
job_id=..., latency_ms=..., completion_tokens=...)``. ``MINISERVE_JSON_LOGS=false``
switches to readable ``key=value`` lines for development.
"""
from __future__ import annotations

import json
import logging
import sys
import time
import traceback

_RESERVED = set(logging.LogRecord("", 0, "", 0, "", None, None).__dict__) | {"message", "asctime"}


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        payload = {
            "ts": round(record.created, 3),
            "level": record.levelname,
            "logger": record.name,
            "event": record.getMessage(),
        }
        payload.update(_extra_fields(record))
        if record.exc_info:
            payload.update(_exception_fields(record.exc_info))
        return json.dumps(payload, ensure_ascii=False, default=str)


def _exception_fields(exc_info) -> dict:
    """Where it failed (type and frames), never the exception's message: messages can
    quote the input (a prompt) that caused them."""
    exc_type, _, tb = exc_info
    frames = [f"{frame.filename.rsplit('/', 1)[-1]}:{frame.lineno}:{frame.name}"
              for frame in traceback.extract_tb(tb)][-12:]
    return {"exc_type": exc_type.__name__ if exc_type else None, "exc_frames": frames}


class PlainFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        stamp = time.strftime("%H:%M:%S", time.localtime(record.created))
        fields = " ".join(f"{k}={v}" for k, v in _extra_fields(record).items())
        return f"{stamp} {record.levelname:<7} {record.name}: {record.getMessage()} {fields}".rstrip()


def _extra_fields(record: logging.LogRecord) -> dict:
    return {k: v for k, v in record.__dict__.items() if k not in _RESERVED and not k.startswith("_")}


def configure_logging(level: str = "INFO", json_logs: bool = True) -> None:
    """Route every logger to stderr in the chosen format (idempotent).

    The real stderr (``sys.__stderr__``): a Celery worker replaces ``sys.stderr`` with a
    proxy that logs what is written to it, so a handler on the proxy swallowed every event."""
    handler = logging.StreamHandler(sys.__stderr__ or sys.stderr)
    handler.setFormatter(JsonFormatter() if json_logs else PlainFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)


def log_event(logger: logging.Logger, event: str, level: int = logging.INFO, **fields: object) -> None:
    """Log one named event with structured fields (ids, latencies, counts: never text)."""
    logger.log(level, event, extra=fields)
