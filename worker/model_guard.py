"""A job for another model is never run here: it is forwarded to that model's queue.

The web stores the model a job is for in its request (``"model"``, core/models.py) and sends
it to a queue only that model's workers consume, so this fires only when a worker of another
model also consumes the shared queues (its ``-Q`` names ``generation``/``agent`` in a cluster
whose web serves another model by default). Running the job would answer with the wrong
model's tokens; failing it would punish the client for a deployment slip. The message is
re-sent, same job id and dispatch number, to ``<kind>.<model id>`` before this delivery is
acknowledged, so the sweeper still finds it waiting and nothing is lost.
"""
from __future__ import annotations

import logging

from core import keys
from core.jobs import JobNotFound
from core.logs import log_event
from worker.runtime import WorkerRuntime

logger = logging.getLogger("miniserve.worker")


def forwarded(rt: WorkerRuntime, celery_app, job_id: str, dispatch: int, task: str, base: str,
              model: str | None = None) -> bool:
    """True when the job asks for a model this worker does not serve (and was re-sent).
    ``model``: what the message says (the web's sends carry it); a message without it (the
    sweeper's and reaper's re-sends) is checked against the stored request."""
    wanted = model
    if wanted is None:
        try:
            wanted = rt.store.get(job_id).request.get("model")
        except JobNotFound:
            return False  # run_job skips it and says why
    if not wanted or wanted == rt.model_id:
        return False
    queue = keys.model_queue(base, wanted)
    celery_app.send_task(task, args=[job_id, dispatch], kwargs={"model": wanted}, task_id=job_id, queue=queue)
    rt.store.mark_dispatched(job_id, queue)  # its place in line is now in that queue
    log_event(logger, "job_forwarded", job_id=job_id, dispatch=dispatch, model=wanted, served=rt.model_id,
              queue=queue)
    return True
