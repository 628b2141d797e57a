"""``python -m web``: serve the app with gunicorn (gevent workers, whose own error pages
are JSON: :mod:`web.gunicorn_worker`; an open SSE stream costs a greenlet, not a thread,
so one process follows thousands of streams). Binds MINISERVE_HOST:MINISERVE_PORT (127.0.0.1:8000 by default);
debug is never on."""
from __future__ import annotations

from typing import Any

from gunicorn.app.base import BaseApplication

from core.logs import configure_logging
from core.settings import Settings, get_settings


class WebServer(BaseApplication):
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        super().__init__()

    def load_config(self) -> None:
        for name, value in gunicorn_options(self.settings).items():
            self.cfg.set(name, value)

    def load(self) -> Any:
        from web.app import create_app

        return create_app(self.settings)


def gunicorn_options(settings: Settings) -> dict[str, Any]:
    return {
        "bind": f"{settings.host}:{settings.port}",
        "worker_class": "web.gunicorn_worker.JsonErrorWorker",  # gevent, errors as JSON
        "workers": settings.web_workers,
        "worker_connections": settings.web_connections,
        "timeout": 60,  # the worker heartbeats from its own greenlet: long SSE streams are fine
        "graceful_timeout": 10,
        "control_socket_disable": True,  # several servers (tests, benches) may run side by side
        "keepalive": settings.header_timeout_s,  # gevent worker: the deadline for request line + headers
        "accesslog": None,  # web.request_log writes one JSON event per request instead
        "errorlog": "-",
        "loglevel": settings.log_level.lower(),
        "logconfig_dict": gunicorn_log_config(settings),
    }


def gunicorn_log_config(settings: Settings) -> dict[str, Any]:
    """With JSON logs on, gunicorn's own messages (start, workers booting, signals) are JSON
    events too, so the whole web log is one JSON object per line; ``{}`` keeps its text format."""
    if not settings.json_logs:
        return {}
    handler = {"class": "logging.StreamHandler", "formatter": "json", "stream": "ext://sys.stderr"}
    logger = {"level": settings.log_level, "handlers": ["json"], "propagate": False}
    return {"version": 1, "disable_existing_loggers": False,
            "formatters": {"json": {"()": "core.logs.JsonFormatter"}},
            "handlers": {"json": handler},
            "root": {"level": settings.log_level, "handlers": ["json"]},
            "loggers": {"gunicorn.error": logger, "gunicorn.access": dict(logger)}}


def main() -> None:
    settings = get_settings()
    configure_logging(settings.log_level, settings.json_logs)
    WebServer(settings).run()


if __name__ == "__main__":
    main()
