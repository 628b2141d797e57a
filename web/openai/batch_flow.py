"""A batch's life: ``validating`` -> ``in_progress`` -> ``finalizing`` -> ``completed``, or
``cancelling`` -> ``cancelled``, ``expired`` past its window, ``failed`` when its input
cannot be read at all.

Who finishes a batch? Whoever looks at it once all its jobs have ended: ``GET
/v1/batches/{id}``, the list, or the ``miniserve.batch`` Celery task polling it. The output
is built from the jobs' stored results (:mod:`web.openai.batch_output`), under file ids
derived from the batch id, so any number of web processes (or one restarted mid-way)
build the same files; a worker SIGKILLed mid-batch only delays its jobs (the reaper
re-queues them) and the output waits for them. No process holds a batch in memory, so
there is nothing to lose; the price is that a batch nobody reads stays ``in_progress``
in Redis after its jobs end, which costs nothing.
"""
from __future__ import annotations

import logging
import time
from typing import Any

from core import keys
from core.batches import BatchRecord, BatchStore, derived_file_id, new_batch_id
from core.events import SUCCEEDED, TERMINAL_STATES
from core.logs import log_event
from web.cancel import cancel_job
from web.context import ctx
from web.openai.batch_lines import parse_lines, submit_line
from web.openai.batch_output import build_files, jobs_of
from web.openai.responses import model_id
from web.submit import job_options

logger = logging.getLogger("miniserve.web.batch")
WINDOW_S = {"24h": 24 * 3600}
VALIDATING_STALE_S = 600  # a batch still validating this long lost its web process


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


def start_batch(text: str, input_file_id: str, endpoint: str, window: str,
                metadata: dict[str, str] | None, owner: str, webhook_url: str | None = None) -> BatchRecord:
    """Store the batch (``validating``), turn every line into a job or an error entry, then
    move it to ``in_progress`` (or ``failed`` when the file holds no line at all). Each line's
    job has the batch's ``expires_at`` as its deadline, and the batch's webhook."""
    store = batch_store()
    batch_id = new_batch_id()
    batch_object = new_object(batch_id, input_file_id, endpoint, window, metadata)
    # The lines' deadline: the window's end (or the job TTL's, if shorter: the records go then).
    deadline = min(float(batch_object["expires_at"]), time.time() + ctx().settings.job_ttl_s - 1)
    options = job_options(deadline=deadline, webhook_url=webhook_url)
    store.create_batch(BatchRecord(batch_id, owner, batch_object, []))
    lines = parse_lines(text, endpoint, ctx().settings.max_body_bytes)
    if not lines:
        errors = {"object": "list", "data": [{"code": "empty_file", "message": "the input file holds no request",
                                              "param": "input_file_id", "line": None}]}
        return store.set_entries(batch_id, [], {"status": "failed", "failed_at": int(time.time()), "errors": errors})
    entries = [submit_line(line, endpoint, options) for line in lines]
    failed = sum(1 for e in entries if "job_id" not in e)
    record = store.set_entries(batch_id, entries, {
        "status": "in_progress", "in_progress_at": int(time.time()),
        "request_counts": {"total": len(entries), "completed": 0, "failed": failed}})
    log_event(logger, "batch_started", batch_id=batch_id, lines=len(entries), refused=failed)
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


def cancel_jobs(job_ids: list[str], reason: str) -> None:
    """Cancel the batch's open jobs as ``POST /jobs/{id}/cancel`` does."""
    for job_id in job_ids:
        cancel_job(ctx().store, ctx().celery, job_id)
    log_event(logger, "batch_jobs_cancelled", jobs=len(job_ids), reason=reason)


def cancel(record: BatchRecord) -> BatchRecord:
    """``cancelling`` now; ``cancelled`` once the open jobs have stopped (the next look)."""
    if record.status not in ("validating", "in_progress"):
        return record
    record = batch_store().update(record.id, lambda obj: {**obj, "status": "cancelling",
                                                          "cancelling_at": int(time.time())})
    states = _states(record.entries)
    cancel_jobs([j for j, s in states.items() if s is not None and s not in TERMINAL_STATES], "cancel")
    return refresh(record)


def refresh(record: BatchRecord) -> BatchRecord:
    """The batch as it stands: counts from its jobs; expired past its window (open jobs
    cancelled); finalized when every job has ended."""
    if record.status in ("completed", "failed", "expired", "cancelled", "finalizing"):
        return _stale_finalizing(record) if record.status == "finalizing" else record
    if record.status == "validating":
        return _stale_validating(record)
    states = _states(record.entries)
    counts = _counts(record.entries, states)
    open_jobs = [j for j, s in states.items() if s is not None and s not in TERMINAL_STATES]
    now = int(time.time())
    if open_jobs and record.status == "in_progress" and now >= record.object["expires_at"]:
        cancel_jobs(open_jobs, "expired")
        record = batch_store().update(record.id, lambda obj: {**obj, "expired_at": now})
        return refresh(record)
    if open_jobs:
        return batch_store().update(record.id, lambda obj: {**obj, "request_counts": counts})
    return finalize(record, counts)


def _stale_validating(record: BatchRecord) -> BatchRecord:
    if time.time() - record.object["created_at"] < VALIDATING_STALE_S:
        return record
    errors = {"object": "list", "data": [{"code": "validation_interrupted", "param": None, "line": None,
                                          "message": "the web process reading the input file stopped"}]}
    return batch_store().update(record.id, lambda obj: {**obj, "status": "failed", "errors": errors,
                                                        "failed_at": int(time.time())})


def _stale_finalizing(record: BatchRecord) -> BatchRecord:
    """A finalizer that died between its two writes: finish its work (the files are the same)."""
    if time.time() - (record.object["finalizing_at"] or 0) < 30:
        return record
    return finalize(record, record.object["request_counts"])


def _end_status(obj: dict[str, Any]) -> tuple[str, str]:
    if obj.get("cancelling_at"):
        return "cancelled", "cancelled_at"
    if obj.get("expired_at"):
        return "expired", "expired_at"
    return "completed", "completed_at"


def finalize(record: BatchRecord, counts: dict[str, int]) -> BatchRecord:
    """``finalizing``, the two files (under ids derived from the batch id), then the end state."""
    store = batch_store()
    record = store.update(record.id, lambda obj: {**obj, "status": "finalizing", "request_counts": counts,
                                                  "finalizing_at": obj.get("finalizing_at") or int(time.time())})
    if record.status != "finalizing":
        return record
    files = build_files(record.id, record.entries, jobs_of(ctx().store, record.entries), model_id(ctx().settings),
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
