"""Notices jobs whose worker died with them (main process and pool), via expired leases.

A pool child killed mid-job is handled by Celery itself (``task_reject_on_worker_lost``
re-delivers the message at once). When the whole worker is lost nobody re-delivers the
message until the broker's visibility timeout (an hour-scale wait): the lease is what
notices it within ``MINISERVE_LEASE_S``. Every worker's main process runs this loop; the
requeue is atomic, so two reapers never re-send the same job twice. The same loop trims
expired ids from the jobs index (records expire by TTL; the index would not).
"""
from __future__ import annotations

import logging
import threading

from celery import Celery

from core import tasks as names
from core.jobs import JobNotFound, JobStore
from core.logs import log_event
from core.routing import rescue_orphans

logger = logging.getLogger("miniserve.reaper")


def reap_once(store: JobStore, celery_app: Celery) -> list[str]:
    """Re-queue (or, past the attempt budget, let the next start fail) expired jobs."""
    requeued = []
    for job_id in store.expired_leases():
        try:
            record = store.get(job_id)
        except JobNotFound:
            store.drop_lease(job_id)
            continue
        dispatch = store.requeue(job_id, record.attempt)
        if not dispatch:
            continue
        celery_app.send_task(names.TASK_FOR_JOB_TYPE[record.type], args=[job_id, dispatch],
                             task_id=job_id, queue=record.queue)
        log_event(logger, "job_requeued", job_id=job_id, attempt=record.attempt, dispatch=dispatch)
        requeued.append(job_id)
    return requeued


def start_reaper(store: JobStore, celery_app: Celery, interval_s: float) -> threading.Event:
    """Run :func:`reap_once` every ``interval_s`` in a daemon thread; set the event to stop."""
    stop = threading.Event()

    def loop() -> None:
        while not stop.wait(interval_s):
            try:
                reap_once(store, celery_app)
                moved = rescue_orphans(store.client)  # routed jobs left in a dead worker's own queue
                if moved:
                    log_event(logger, "routed_jobs_rescued", count=moved)
                store.trim_index()
            except Exception as exc:  # noqa: BLE001 - Redis blips must not kill the reaper
                log_event(logger, "reaper_failed", level=logging.WARNING, error=type(exc).__name__)

    threading.Thread(target=loop, name="miniserve-reaper", daemon=True).start()
    return stop
