"""Celery signal handlers: per-process runtime, heartbeats, the reaper, clean shutdown."""
from __future__ import annotations

import logging
import sys
import threading

from celery.signals import setup_logging, worker_init, worker_process_init, worker_process_shutdown, worker_ready, worker_shutdown
from celery.utils.log import LoggingProxy, get_logger

from core.logs import configure_logging
from core.settings import get_settings
from worker import broker_patch
from worker.affinity import pin_process
from worker import runtime as rt_module

broker_patch.install()  # a worker must survive Redis going away mid-task (see the module)


@setup_logging.connect
def _logging(**_: object) -> None:
    """Our JSON logs for Celery's own messages too (connecting this stops Celery from
    installing its text format), so the worker log is JSON lines after the start-up banner.
    Stray writes to stdout/stderr (library warnings, progress bars) become log events, as
    Celery's own set-up would have done."""
    settings = get_settings()
    configure_logging(settings.log_level, settings.json_logs)
    proxy = LoggingProxy(get_logger("celery.redirected"), logging.WARNING)
    sys.stdout = sys.stderr = proxy  # type: ignore[assignment]


@worker_init.connect
def _remember_pool(sender=None, **_: object) -> None:
    settings = get_settings()
    pin_process(settings.worker_cpus, settings.threads)  # before the pool and engine threads start
    pool = getattr(sender, "pool_cls", None)
    pool_name = getattr(pool, "__module__", str(pool)).rsplit(".", 1)[-1] if pool else "prefork"
    rt_module.configure(pool_name, int(getattr(sender, "concurrency", 1) or 1), getattr(sender, "hostname", None))


@worker_process_init.connect
def _child_started(**_: object) -> None:
    """In a prefork child: heartbeat now, model warm-up in the background (init must be quick)."""
    rt = rt_module.runtime()
    threading.Thread(target=lambda: rt.engine, name="miniserve-preload", daemon=True).start()


@worker_ready.connect
def _main_ready(sender=None, **_: object) -> None:
    from worker.app import app
    from core.webhooks import webhook_store
    from worker.reaper import start_reaper

    settings = get_settings()
    configure_logging(settings.log_level, settings.json_logs)
    store = rt_module.make_store(settings)
    start_reaper(store, app, interval_s=max(1.0, min(settings.lease_s / 4, settings.worker_dead_s / 3)),
                 lease_s=settings.lease_s, max_redispatches=settings.max_attempts,
                 webhooks=webhook_store(store.client, settings), gate_settings=settings,
                 dead_after_s=settings.worker_dead_s)
    pool = rt_module._pool_info[0]
    if pool != "prefork":  # jobs run in this very process: heartbeat and warm the model here
        rt = rt_module.runtime()
        threading.Thread(target=lambda: rt.engine, name="miniserve-preload", daemon=True).start()


@worker_process_shutdown.connect
@worker_shutdown.connect
def _leave(**_: object) -> None:
    rt = rt_module._runtime
    if rt is not None:
        try:
            rt.leave()
        except Exception:  # noqa: BLE001 - shutting down anyway
            pass
