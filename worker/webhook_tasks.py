"""The ``miniserve.webhook`` task: one delivery try of a finished job's record.

How tries are claimed, counted, retried and dead-lettered is :mod:`core.webhooks`; the
target rules are :mod:`core.webhook_target`; the signature :mod:`core.webhook_sign`. This
module joins them: claim (unless the sender did), mark the try (never twice), build and sign
the body, POST it (worker/webhook_http.py), report the answer, and after a failure send
the next try with a countdown (the reaper loop sends it anyway once it is due, should that
message be lost).
"""
from __future__ import annotations

import http.client
import json
import logging
import time
from typing import Any

from core import tasks as names
from core import webhook_sign, webhook_target
from core.job_view import public_record
from core.jobs import JobNotFound
from core.logs import log_event
from core.webhooks import RETRYING, Claimed, backoff_s, message_id, secret_for, task_sender, webhook_store
from worker.app import app
from worker.runtime import WorkerRuntime, runtime
from worker.webhook_http import post

logger = logging.getLogger("miniserve.webhooks")


def kick(rt: WorkerRuntime, job_id: str) -> None:
    """The job just ended here: claim its webhook's first try now (no wait for the reaper
    loop). Best effort: an unclaimed entry stays due in the outbox."""
    try:
        webhook_store(rt.store.client, rt.settings).dispatch(task_sender(app), [job_id])
    except Exception as exc:  # noqa: BLE001 - the reaper loop drains the outbox anyway
        log_event(logger, "webhook_kick_failed", level=logging.WARNING, job_id=job_id, error=type(exc).__name__)


@app.task(name=names.WEBHOOK, ignore_result=True)
def deliver(job_id: str, round_no: int = 0, try_no: int = 0) -> str:
    """One try; ``try_no`` 0: claim the entry here (a retry's countdown message)."""
    rt = runtime()
    store = webhook_store(rt.store.client, rt.settings)
    claimed = Claimed(job_id, round_no, try_no) if try_no > 0 else store.claim(job_id)
    if claimed is None:
        return "not_due"
    if not store.mark_try(claimed):
        log_event(logger, "webhook_try_repeated", job_id=job_id, try_id=claimed.try_id)
        return "repeated"
    ok, answer = _try(rt, job_id)
    last = claimed.try_no >= rt.settings.webhook_max_tries
    wait = backoff_s(claimed.try_no, rt.settings.webhook_backoff_s, rt.settings.webhook_backoff_max_s)
    outcome = store.report(claimed, ok, answer, None if last else time.time() + wait)
    log_event(logger, "webhook_try", job_id=job_id, try_id=claimed.try_id, outcome=outcome,
              status=answer.get("status"), error=answer.get("error"))
    if outcome == RETRYING:
        task_sender(app)(job_id, 0, 0, countdown=wait)
    return outcome


def _try(rt: WorkerRuntime, job_id: str) -> tuple[bool, dict[str, Any]]:
    """(2xx came back, what the receiver answered or what went wrong)."""
    try:
        record = rt.store.get(job_id)
    except JobNotFound:
        return False, {"error": "job_gone", "message": "the job's record expired"}
    secret = secret_for(rt.settings, record.owner)
    if not record.webhook_url or not secret:
        return False, {"error": "not_configured", "message": "no webhook_url or no secret for the job's key"}
    body = json.dumps(public_record(record), ensure_ascii=False, separators=(",", ":")).encode()
    headers = webhook_sign.headers(secret, message_id(job_id), int(time.time()), body)
    try:
        target = webhook_target.check(record.webhook_url, rt.settings.webhook_allow_hosts)
        status = post(target, body, headers, rt.settings.webhook_timeout_s, rt.settings.webhook_max_response_bytes)
    except webhook_target.TargetRefused as exc:
        return False, {"error": "target_refused", "message": str(exc)}
    except (OSError, http.client.HTTPException) as exc:  # TimeoutError and ConnectionError are OSErrors
        return False, {"error": type(exc).__name__}
    return 200 <= status < 300, {"status": status}
