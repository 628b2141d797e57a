"""One attempt of one job, from ``start_attempt`` to its single terminal state.

Every job type (generation, agent, bench) runs through :func:`run_job`, which owns the
parts they share: the lease that proves the attempt is alive, cooperative cancellation (by
message: worker/cancel_watch.py) and the time limit (both read between tokens), streaming
events, and mapping outcomes to exactly one terminal state.
"""
from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from celery.exceptions import SoftTimeLimitExceeded

from core.coalesce import TextCoalescer
from core.fair_gate import FairGate, release_queues
from core.events import CANCELLED, FAILED, SUCCEEDED, TIMEOUT, TOKEN
from core.jobs import JobRecord, JobStore
from core.logs import log_event
from engine.paged.pool import KVPoolExhausted
from worker.choice_stream import ChoiceStreams
from worker.runtime import ModelUnavailable, WorkerRuntime
from worker.app import app
from worker.reaper import requeue_if_holder_gone
from worker.webhook_tasks import kick

logger = logging.getLogger("miniserve.worker")
EXPIRED_CODE = -2  # start_attempt's answer for a job whose deadline passed: ended ``expired``, unrun
ALREADY_RUNNING = -1  # start_attempt's seq (attempt 0) for a job another attempt holds


class BadJobRequest(ValueError):
    """The stored request cannot be run (the web validates, so this means a protocol bug)."""


class JobFailed(Exception):
    """A job body's own verdict that the job failed, with the error payload to store
    (e.g. an agent run that hit its step limit, with its trace)."""

    def __init__(self, code: str, message: str, **extra: Any) -> None:
        super().__init__(message)
        self.payload = {"code": code, "message": message, **extra}


@dataclass
class JobContext:
    """What a job body gets: its record, and the callbacks the engine needs."""

    store: JobStore
    record: JobRecord
    attempt: int
    deadline: float
    stopped_reason: str | None = None  # "cancelled" | "timeout" | "superseded"
    text: TextCoalescer = field(default_factory=TextCoalescer)  # token chunks -> fewer events
    tokens_done: int = 0             # generated tokens of this job's finished engine requests
    _streaming: Any = None           # the engine request streaming now (its ``tokens_streamed``)
    _counting: bool = False          # token events say how many tokens the job has generated
    record_ids: bool = False         # token events carry the ids they complete (worker/resume.py)
    _ids_sent: int = 0               # generated ids already carried by this attempt's events
    _ids_from: Any = None            # the engine request whose ids they are (kept past its end: the last flush)
    cancel: threading.Event = field(default_factory=threading.Event)  # set by the worker's CancelWatch
    _paused_at: float | None = None    # the clock is paused while waiting for the engine loop
    _choices: ChoiceStreams | None = None  # per-choice chunks (worker.choice_stream), built on first use
    # The job's own deadline (its ``deadline``/``timeout_s``, on this process's monotonic clock):
    # unlike the per-attempt limit above, it does not pause while the request waits for the loop.
    job_deadline: float | None = None
    clock: Callable[[], float] = time.monotonic  # the time limits' clock, the engine loop's (a test steps both)

    @property
    def job_id(self) -> str:
        return self.record.id

    def emit(self, event_type: str, data: dict[str, Any]) -> None:
        if event_type != TOKEN:
            self.flush_text()  # held text goes out first: events stay in order
        if self.store.append_event(self.job_id, self.attempt, event_type, data) < 0:
            self.stopped_reason = self.stopped_reason or "superseded"

    @property
    def choices(self) -> ChoiceStreams:
        if self._choices is None:
            self._choices = ChoiceStreams(self.text)
        return self._choices

    def on_text(self, text: str) -> None:
        self.on_choice_text(0, text)

    def on_choice_text(self, index: int, text: str) -> None:
        data = self.choices.add(index, text)
        if data:
            self.emit(TOKEN, self._with_tokens(data))

    def on_choice_logprobs(self, index: int, entries: list[dict[str, Any]]) -> None:
        """Held until the choice's next chunk (the entries come before their text)."""
        self.choices.add_logprobs(index, entries)

    def flush_text(self) -> None:
        for data in self.choices.flush():
            self.emit(TOKEN, self._with_tokens(data))

    def follow_tokens(self, handle: Any) -> None:
        """Count this engine request's tokens (``handle.tokens_streamed``) in token events."""
        self._streaming, self._ids_from, self._counting = handle, handle, True
        resume = handle.request.resume if self.record_ids else None
        self._ids_sent = len(resume.ids) if resume is not None else 0

    def end_tokens(self, completion_tokens: int) -> None:
        """The request ended with ``completion_tokens`` (an agent's next call counts on)."""
        self.tokens_done += completion_tokens
        self._streaming = None

    def _with_tokens(self, data: dict[str, Any]) -> dict[str, Any]:
        """``tokens``: the job's generated tokens up to this chunk's end, so a client can plot
        tokens (not characters) over time; a chunk may hold several tokens' text. Single-choice
        jobs only (a job of several choices streams them side by side). ``ids`` (generation
        jobs): the token ids whose text this chunk completes, so a later attempt can continue
        the answer where the stream stopped (worker/resume.py)."""
        if not self._counting or "index" in data:
            return data
        streaming = self._streaming.tokens_streamed if self._streaming is not None else 0
        data = {**data, "tokens": self.tokens_done + streaming}
        if self.record_ids and self._ids_from is not None:
            ids = self._ids_from.covered_ids(self._ids_sent)
            self._ids_sent += len(ids)
            data["ids"] = ids
        return data

    def pause_clock(self) -> None:
        """Stop counting the time limit (a request now waits for the engine loop)."""
        if self._paused_at is None:
            self._paused_at = self.clock()

    def resume_clock(self, at: float | None = None) -> None:
        """Count again from ``at`` (when the loop started the request): the wait is not charged."""
        if self._paused_at is not None:
            self.deadline += max(0.0, (self.clock() if at is None else at) - self._paused_at)
            self._paused_at = None

    def time_left(self) -> float:
        now = self._paused_at if self._paused_at is not None else self.clock()
        left = self.deadline - now
        if self.job_deadline is not None:
            left = min(left, self.job_deadline - self.clock())
        return max(0.0, left)

    def should_cancel(self) -> bool:
        """Read between tokens, without Redis: the cancel event (worker/cancel_watch.py), the
        time limit and the job's deadline, a superseded attempt."""
        if self.stopped_reason:
            return True
        now = self.clock()
        if (self._paused_at is None and now >= self.deadline) or \
                (self.job_deadline is not None and now >= self.job_deadline):
            self.stopped_reason = "timeout"
        elif self.cancel.is_set():
            self.stopped_reason = "cancelled"
        return self.stopped_reason is not None


@dataclass
class LeaseKeeper:
    """Renews the job's lease while the attempt runs, so a dead worker's job is noticed."""

    store: JobStore
    job_id: str
    lease_s: int
    _stop: threading.Event = field(default_factory=threading.Event)

    def __enter__(self) -> "LeaseKeeper":
        threading.Thread(target=self._loop, name=f"lease-{self.job_id[:8]}", daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()

    def _loop(self) -> None:
        wait = self.lease_s / 4
        while not self._stop.wait(wait):
            try:
                self.store.renew_lease(self.job_id, self.lease_s)
                wait = self.lease_s / 4
            except Exception as exc:  # noqa: BLE001 - a renewal failure must not kill the job
                wait = min(1.0, self.lease_s / 4)  # renew as soon as Redis is back (reaper grace: one lease)
                log_event(logger, "lease_renew_failed", level=logging.WARNING,
                          job_id=self.job_id, error=type(exc).__name__)


JobBody = Callable[[JobContext], dict[str, Any]]


@dataclass(frozen=True)
class Ended:
    """The terminal state this attempt wrote, and its result or error payload."""

    state: str
    payload: dict[str, Any]


def _line_moved(rt: WorkerRuntime, job_id: str, record: JobRecord | None) -> None:
    """The job left its queue's line (started, or found ended) or its worker slot (ended):
    the fair gate's next held job may go out (core/fair_gate.py)."""
    try:
        queue = record.queue if record is not None else rt.store.get(job_id).queue
    except Exception:  # noqa: BLE001 - the job is gone; the reaper's tick releases the queue
        return
    release_queues(FairGate.from_settings(rt.store.client, rt.settings), rt.store, app, [queue])


def run_job(rt: WorkerRuntime, job_id: str, dispatch: int, body: JobBody) -> Ended | None:
    """Run one attempt; returns how it ended, or None when skipped (or another ending won)."""
    started = rt.store.start_attempt(job_id, rt.name, rt.settings.lease_s, dispatch)
    _line_moved(rt, job_id, started.record)
    if not started.should_run:
        log_event(logger, "job_expired" if started.attempt == EXPIRED_CODE else "job_skipped",
                  job_id=job_id, dispatch=dispatch, code=started.attempt)
        if started.attempt in (EXPIRED_CODE, -1):  # this start ended the job: its webhook is due
            kick(rt, job_id)
        elif started.seq == ALREADY_RUNNING:  # a re-delivery: was its holder a pool process that died?
            requeue_if_holder_gone(rt.store, app, job_id, rt.node)
        return None
    record = started.record or rt.store.get(job_id)  # the script hands the stored request over
    log_event(logger, "job_started", job_id=job_id, job_type=record.type, attempt=started.attempt,
              queue_wait_ms=round((time.time() - record.created_at) * 1000, 1))
    began = time.perf_counter()
    with rt.tracking(job_id), rt.cancels.watching(job_id) as cancel, \
            LeaseKeeper(rt.store, job_id, rt.settings.lease_s):
        ctx = JobContext(rt.store, record, started.attempt,
                         deadline=time.monotonic() + rt.settings.soft_time_limit_s,
                         text=TextCoalescer(rt.settings.token_event_interval_ms / 1000), cancel=cancel,
                         job_deadline=monotonic_deadline(record.deadline))
        state, payload = _outcome(ctx, body)
        _flush_text(ctx)
    written = rt.store.finish(job_id, state, payload, attempt=started.attempt,
                              keep_token_ids=bool(record.request.get("return_token_ids")))
    _line_moved(rt, job_id, record)  # a slot is free: a class held back by its cap may go
    log_event(logger, "job_finished", job_id=job_id, job_type=record.type, state=state,
              attempt=started.attempt, latency_ms=round((time.perf_counter() - began) * 1000, 1),
              completion_tokens=payload.get("usage", {}).get("completion_tokens"),
              recorded=bool(written))
    if written and record.webhook_url:
        kick(rt, job_id)
    return Ended(state, payload) if written else None


def monotonic_deadline(deadline: float | None) -> float | None:
    """A job's wall-clock deadline on this process's monotonic clock (what the poll reads)."""
    return None if deadline is None else time.monotonic() + (deadline - time.time())


def _flush_text(ctx: JobContext) -> None:
    """The last held text chunk, before the terminal event (Redis trouble: logged, the
    result still carries the whole text)."""
    try:
        ctx.flush_text()
    except Exception as exc:  # noqa: BLE001
        log_event(logger, "flush_text_failed", level=logging.WARNING, job_id=ctx.job_id, error=type(exc).__name__)


def _outcome(ctx: JobContext, body: JobBody) -> tuple[str, dict[str, Any]]:
    """Map what the body did to (terminal state, result-or-error payload)."""
    try:
        result = body(ctx)
    except SoftTimeLimitExceeded:
        return TIMEOUT, {"code": "timeout", "message": "the job exceeded its soft time limit"}
    except BadJobRequest as exc:
        return FAILED, {"code": "bad_request", "message": str(exc)}
    except JobFailed as exc:
        return FAILED, exc.payload
    except ModelUnavailable as exc:   # the worker's model failed to load: say why, once per job
        return FAILED, {"code": "model_unavailable", "message": str(exc)}
    except KVPoolExhausted as exc:   # the web checks the pool first: only a web/worker settings mismatch
        return FAILED, {"code": "context_exceeded", "message": f"the worker's KV pool cannot hold this request: {exc}"}
    except Exception as exc:  # noqa: BLE001 - every failure must end the job, never leave it running
        if ctx.stopped_reason in ("cancelled", "timeout"):  # the body gave up because we asked it to
            return _stopped(ctx, None)
        log_event(logger, "job_error", level=logging.ERROR, job_id=ctx.job_id, error=type(exc).__name__)
        return FAILED, {"code": "internal_error", "message": f"{type(exc).__name__} while running the job"}
    if ctx.stopped_reason in ("cancelled", "timeout"):
        return _stopped(ctx, result)
    return SUCCEEDED, result


def _stopped(ctx: JobContext, partial: dict[str, Any] | None) -> tuple[str, dict[str, Any]]:
    if ctx.stopped_reason == "timeout":
        reached = ctx.job_deadline is not None and ctx.clock() >= ctx.job_deadline
        message = "the job reached its deadline" if reached else "the job exceeded its time limit"
        return TIMEOUT, {"code": "timeout", "message": message, "partial": partial}
    return CANCELLED, {"code": "cancelled", "message": "cancelled by request", "partial": partial}
