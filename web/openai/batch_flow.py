"""A batch's life: ``validating`` -> ``in_progress`` -> ``finalizing`` -> ``completed``, or
``cancelling`` -> ``cancelled``, ``expired`` past its window, ``failed`` when its input
holds no request or its intake stopped.

``POST /v1/batches`` stores the batch ``validating`` and answers; a thread of that web
process reads the input and queues the lines (:mod:`web.openai.batch_intake`), then moves
it to ``in_progress``. A batch whose intake made no progress for
``MINISERVE_BATCH_INTAKE_STALE_S`` lost its process: the next look fails it and cancels
the jobs it had queued.

Who finishes a batch? Whoever looks at it once all its jobs have ended: ``GET
/v1/batches/{id}``, the list, or the ``miniserve.batch`` Celery task polling it (through
``GET /v1/batches/{id}``). The output is built from the jobs' stored results
(:mod:`web.openai.batch_output`), under file ids derived from the batch id, so any number
of web processes (or one restarted mid-way) build the same files; a worker SIGKILLed
mid-batch only delays its jobs (the reaper re-queues them) and the output waits for them.
No process holds a running batch in memory, so there is nothing to lose; the price is that
a batch nobody reads stays ``in_progress`` in Redis after its jobs end, which costs nothing.
"""
from __future__ import annotations

import logging
import time
from typing import Any

from core import keys
from core.batches import BatchRecord, BatchStore, derived_file_id, new_batch_id
from core.events import SUCCEEDED, TERMINAL_STATES
from core.logs import log_event
from web.cancel import cancel_jobs
from web.context import ctx, request_owner
from web.openai.batch_intake import Intake, fail, start as start_intake
from web.openai.batch_output import build_files, jobs_of
from web.openai.responses import model_id
from web.submit import job_options

logger = logging.getLogger("miniserve.web.batch")
WINDOW_S = {"24h": 24 * 3600}


def batch_store() -> BatchStore:
    return BatchStore(ctx().store.client, ttl_s=ctx().settings.job_ttl_s)


def new_object(batch_id: str, input_file_id: str, endpoint: str, window: str,
               metadata: dict[str, str] | None) -> dict[str, Any]:
    now = int(time.time())
    return {"id": batch_id, "object": "batch", "endpoint": endpoint, "errors": None,
            "input_file_id": input_file_id, "completion_window": window, "status": "validating",
            "output_file_id": None, "error_file_id": None, "created_at": now, "in_progress_at": None,
            "expires_at": now + WINDOW_S[window], "finalizing_at": None, "completed_at": None,
            "failed_at": None, "expired_at": None, "cancelling_at": None, "cancelled_at": None,
            "request_counts": {"total": 0, "completed": 0, "failed": 0}, "metadata": metadata}


def start_batch(input_file_id: str, endpoint: str, window: str, metadata: dict[str, str] | None,
                owner: str, webhook_url: str | None = None) -> BatchRecord:
    """Store the batch ``validating`` and start its intake; returns at once, whatever the
    file holds. Each line's job has the batch's ``expires_at`` as its deadline, and the
    batch's webhook (checked here, so a bad one is a 400 of this POST)."""
    batch_id = new_batch_id()
    batch_object = new_object(batch_id, input_file_id, endpoint, window, metadata)
    # The lines' deadline: the window's end (or the job TTL's, if shorter: the records go then).
    deadline = min(float(batch_object["expires_at"]), time.time() + ctx().settings.job_ttl_s - 1)
    options = job_options(deadline=deadline, webhook_url=webhook_url)
    record = BatchRecord(batch_id, owner, batch_object)
    batch_store().create_batch(record)
    start_intake(Intake(batch_id, input_file_id, endpoint, options, request_owner()))
    log_event(logger, "batch_created", batch_id=batch_id)
    return record


def _states(entries: list[dict[str, Any]]) -> dict[str, str | None]:
    pipe = ctx().store.client.pipeline(transaction=False)
    ids = [e["job_id"] for e in entries if "job_id" in e]
    for job_id in ids:
        pipe.hget(keys.job_key(job_id), "state")
    return dict(zip(ids, pipe.execute()))


def _counts(entries: list[dict[str, Any]], states: dict[str, str | None]) -> dict[str, int]:
    completed = sum(1 for s in states.values() if s == SUCCEEDED)
    failed = sum(1 for e in entries if "job_id" not in e)
    failed += sum(1 for s in states.values() if s is None or (s in TERMINAL_STATES and s != SUCCEEDED))
    return {"total": len(entries), "completed": completed, "failed": failed}


def cancel(record: BatchRecord) -> BatchRecord:
    """``cancelling`` now; ``cancelled`` once the open jobs have stopped (the next look)."""
    if record.status not in ("validating", "in_progress"):
        return record
    record = batch_store().update(record.id, lambda obj: {**obj, "status": "cancelling",
                                                          "cancelling_at": int(time.time())})
    _cancel_open(batch_store().entries(record.id), "cancel")
    return refresh(record)


def _cancel_open(entries: list[dict[str, Any]], reason: str) -> None:
    states = _states(entries)
    cancel_jobs(ctx().store, ctx().celery, [j for j, s in states.items() if s is not None and s not in TERMINAL_STATES],
                reason)


def refresh(record: BatchRecord) -> BatchRecord:
    """The batch as it stands: counts from its jobs; expired past its window (open jobs
    cancelled); finalized when every job has ended."""
    if record.status in ("completed", "failed", "expired", "cancelled", "finalizing"):
        return _stale_finalizing(record) if record.status == "finalizing" else record
    if record.status == "validating":
        return _stale_validating(record)
    entries = batch_store().entries(record.id)
    states = _states(entries)
    counts = _counts(entries, states)
    open_jobs = [j for j, s in states.items() if s is not None and s not in TERMINAL_STATES]
    now = int(time.time())
    if open_jobs and record.status == "in_progress" and now >= record.object["expires_at"]:
        cancel_jobs(ctx().store, ctx().celery, open_jobs, "expired")
        record = batch_store().update(record.id, lambda obj: {**obj, "expired_at": now})
        return refresh(record)
    if open_jobs:
        return batch_store().update(record.id, lambda obj: {**obj, "request_counts": counts})
    return finalize(record, counts, entries)


def _stale_validating(record: BatchRecord) -> BatchRecord:
    """A batch whose intake stopped appending lost its web process: failed, and the jobs its
    entries name cancelled (a resubmitted file must not race the half-queued one)."""
    if time.time() - record.progress_at < ctx().settings.batch_intake_stale_s:
        return record
    store = batch_store()
    fail(store, record.id, "validation_interrupted", "the web process reading the input file stopped")
    _cancel_open(store.entries(record.id), "validation_interrupted")
    log_event(logger, "batch_intake_interrupted", level=logging.WARNING, batch_id=record.id)
    return store.get_batch(record.id)


def _stale_finalizing(record: BatchRecord) -> BatchRecord:
    """A finalizer that died between its two writes: finish its work (the files are the same)."""
    if time.time() - (record.object["finalizing_at"] or 0) < 30:
        return record
    return finalize(record, record.object["request_counts"], batch_store().entries(record.id))


def _end_status(obj: dict[str, Any]) -> tuple[str, str]:
    if obj.get("cancelling_at"):
        return "cancelled", "cancelled_at"
    if obj.get("expired_at"):
        return "expired", "expired_at"
    return "completed", "completed_at"


def finalize(record: BatchRecord, counts: dict[str, int], entries: list[dict[str, Any]]) -> BatchRecord:
    """``finalizing``, the two files (under ids derived from the batch id), then the end state."""
    store = batch_store()
    record = store.update(record.id, lambda obj: {**obj, "status": "finalizing", "request_counts": counts,
                                                  "finalizing_at": obj.get("finalizing_at") or int(time.time())})
    if record.status != "finalizing":
        return record
    files = build_files(record.id, entries, jobs_of(ctx().store, entries), model_id(ctx().settings),
                        str(record.object.get("endpoint") or "/v1/chat/completions"))
    ids: dict[str, str | None] = {"output_file_id": None, "error_file_id": None}
    for field, kind, lines in (("output_file_id", "output", files.output), ("error_file_id", "error", files.errors)):
        if lines:
            ids[field] = store.put_file("batch_output", f"{record.id}_{kind}.jsonl", "\n".join(lines) + "\n",
                                        record.owner, derived_file_id(record.id, kind)).id
    status, stamp = _end_status(record.object)
    record = store.update(record.id, lambda obj: {**obj, **ids, "status": status,
                                                  stamp: obj.get(stamp) or int(time.time())})
    log_event(logger, "batch_finalized", batch_id=record.id, status=status, **counts)
    return record
