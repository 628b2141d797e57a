"""A batch's intake: its input file read line by line, after ``POST /v1/batches`` has answered.

Why a thread of the web process that took the POST: validating a line is the web's own
work (its endpoint's field table, token counting with the model's tokenizer, limits,
routing: :mod:`web.openai.batch_lines`), so it runs where that code lives, and the POST
answers ``validating`` at once whatever the file holds. Under gunicorn's gevent worker the
thread is a greenlet; each line's Redis calls (and a ``sleep(0)`` per chunk) let the
process's other requests run between lines (a ``sleep(0)`` per line cost a quarter of a
line's time on a busy machine).

Memory stays bounded: the file's text is read once, its lines are cut one at a time
(:func:`web.openai.batch_lines.split_lines`), and every ``CHUNK`` lines their entries go
to Redis (:meth:`core.batches.BatchStore.append_entries`) with a progress stamp. A line
over the body cap is refused by its size, never parsed or tokenized.

If the process dies mid-way, nothing resumes it: the batch stays ``validating`` with no
progress, and the first reader after ``MINISERVE_BATCH_INTAKE_STALE_S`` fails it
(``validation_interrupted``) and cancels the jobs its entries already name
(:func:`web.openai.batch_flow.refresh`). Resuming would need to know which of the last
chunk's lines were queued before the death; failing cleanly needs nothing. Jobs of the
chunk in flight at the death are not in the entries: they run and end like any job, and
no batch reports them.
"""
from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from typing import Any, Iterable

from flask import Flask, current_app, g

from core.batches import BatchStore, NotFound
from core.logs import log_event
from web.cancel import cancel_jobs
from web.context import ctx
from web.models import reuse_cluster_views
from web.openai.batch_lines import Line, read_lines, submit_line
from web.submit import Options

logger = logging.getLogger("miniserve.web.batch")
CHUNK = 100  # lines per append: at most this many jobs are queued ahead of their entries


@dataclass(frozen=True)
class Intake:
    """What the intake of one batch needs, taken from the request that created it."""

    batch_id: str
    input_file_id: str
    endpoint: str
    options: Options
    owner: str | None  # the request's owner (None: auth off), for submit's limits and the jobs' owner


@dataclass
class Tally:
    lines: int = 0
    refused: int = 0


def start(intake: Intake) -> threading.Thread:
    """Run the intake in a daemon thread of this process, in an app context of this app."""
    app = current_app._get_current_object()  # type: ignore[attr-defined]
    thread = threading.Thread(target=_run, args=(app, intake), daemon=True, name=f"batch-intake-{intake.batch_id}")
    thread.start()
    return thread


def _run(app: Flask, intake: Intake) -> None:
    with app.app_context():
        g.owner = intake.owner
        reuse_cluster_views()  # every line resolves its model: one heartbeat read a second serves them
        store = BatchStore(ctx().store.client, ttl_s=ctx().settings.job_ttl_s)
        try:
            tally = read_into(store, intake)
            if tally is not None:
                finish(store, intake.batch_id, tally)
        except Exception as exc:  # noqa: BLE001 - a bug or an outage: fail the batch now, not after the stale wait
            log_event(logger, "batch_intake_failed", level=logging.ERROR, batch_id=intake.batch_id,
                      error=type(exc).__name__)
            fail(store, intake.batch_id, "validation_error", f"reading the input file stopped ({type(exc).__name__})")


def read_into(store: BatchStore, intake: Intake) -> Tally | None:
    """Every line's entry appended, chunk by chunk; ``None`` when the batch left
    ``validating`` meanwhile (cancelled, or failed as stale): the chunk's jobs are cancelled."""
    try:
        text = store.get_file(intake.input_file_id).content
    except NotFound:
        fail(store, intake.batch_id, "file_not_found", "input_file_id: the file was deleted before its lines were read",
             param="input_file_id")
        return None
    lines = read_lines(text, intake.endpoint, ctx().settings.max_body_bytes)
    tally = Tally()
    for chunk in _chunks(lines, CHUNK):
        entries = [_entry(line, intake) for line in chunk]
        tally.lines += len(entries)
        tally.refused += sum(1 for e in entries if "job_id" not in e)
        if store.append_entries(intake.batch_id, entries) != "validating":
            _withdraw(entries, intake.batch_id)
            return None
        time.sleep(0)  # a yield between chunks (each line's Redis calls yield to gevent already)
    return tally


def _entry(line: Line, intake: Intake) -> dict[str, Any]:
    return submit_line(line, intake.endpoint, intake.options)


def _chunks(lines: Iterable[Line], size: int) -> Iterable[list[Line]]:
    chunk: list[Line] = []
    for line in lines:
        chunk.append(line)
        if len(chunk) == size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def _withdraw(entries: list[dict[str, Any]], batch_id: str) -> None:
    """The batch was cancelled (or failed) while this chunk was queued: its jobs go too."""
    cancel_jobs(ctx().store, ctx().celery, [e["job_id"] for e in entries if "job_id" in e], "intake_stopped")
    log_event(logger, "batch_intake_stopped", batch_id=batch_id, lines=len(entries))


def finish(store: BatchStore, batch_id: str, tally: Tally) -> None:
    """Every line has its entry: ``in_progress``, or ``failed`` when the file held no request."""
    if tally.lines == 0:
        fail(store, batch_id, "empty_file", "the input file holds no request", param="input_file_id")
        return
    counts = {"total": tally.lines, "completed": 0, "failed": tally.refused}
    store.update(batch_id, lambda obj: {**obj, "status": "in_progress", "in_progress_at": int(time.time()),
                                        "request_counts": counts} if obj["status"] == "validating" else None)
    log_event(logger, "batch_started", batch_id=batch_id, lines=tally.lines, refused=tally.refused)


def fail(store: BatchStore, batch_id: str, code: str, message: str, param: str | None = None) -> None:
    """``validating`` -> ``failed`` with one error naming why (nothing if it already moved on)."""
    errors = {"object": "list", "data": [{"code": code, "message": message, "param": param, "line": None}]}
    try:
        store.update(batch_id, lambda obj: {**obj, "status": "failed", "errors": errors,
                                            "failed_at": int(time.time())} if obj["status"] == "validating" else None)
    except NotFound:
        pass
