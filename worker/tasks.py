"""Celery tasks. Each takes the job id (the Celery task id is the job id), a dispatch number
and (from the web) the model the job is for. The job's request lives in Redis, not in the
message: the record must outlive the message for ``GET /jobs/{id}`` and for the re-sends of
the sweeper and the reaper after a worker died. The web writes it once, and the worker gets
it back in the same round trip that starts the attempt (``START_ATTEMPT``)."""
from __future__ import annotations

import logging
from dataclasses import replace
from typing import Any

from celery import Task

from core import tasks as names
from core.events import TOOL_STEP, WAITING
from core.logs import log_event
from core.methods import BATCHED_METHOD
from core.priorities import rank
from core.routing import note_prefix
from engine.constrained.compiler import GrammarError
from engine.errors import InsufficientMemoryError
from engine.group import IndexedLogprobs, IndexedText, stream_group
from engine.types import CancelCheck, GenerationRequest, GenerationResult, LogprobsCallback, TextCallback
from worker.app import app
from worker.celery_state import TASK_THROWS, report_outcome
from worker.choices import group_result
from worker.job_runner import JobContext, JobFailed, run_job
from worker.model_guard import forwarded
from worker.requests import group_from
from worker.resume import streamed_answer
from worker.runtime import WorkerRuntime, runtime

logger = logging.getLogger("miniserve.worker")
WAITING_AFTER_S = 0.1  # a request not started by then gets a ``waiting`` event


class WorkerGenerator:
    """The engine as seen by one job: every request goes to the process's engine loop
    (``paged`` joins the shared batch, the other methods run one at a time between steps).
    Text and cancel checks run here, in the job thread; the loop never waits on Redis.

    With a ``ctx``, the job's time limit pauses while the request waits for the loop, the
    loop gets the time left as the request's deadline, and a wait longer than
    ``WAITING_AFTER_S`` is told to the client as ``waiting`` events (true, then false)."""

    def __init__(self, rt: WorkerRuntime, ctx: JobContext | None = None) -> None:
        self.rt = rt
        self.ctx = ctx

    def generate(self, request: GenerationRequest, on_text: TextCallback | None = None,
                 should_cancel: CancelCheck | None = None,
                 on_logprobs: LogprobsCallback | None = None) -> GenerationResult:
        if self.ctx is None:
            return self.rt.engine.generate(request, on_text=on_text, should_cancel=should_cancel)
        handle = self.rt.engine.loop.submit(request, timeout_s=self.ctx.time_left(), should_cancel=should_cancel)
        self.ctx.follow_tokens(handle)
        result = self._follow([handle], request.method,
                              lambda started: [handle.stream(on_text, should_cancel, on_start=started,
                                                             on_logprobs=on_logprobs)])[0]
        self.ctx.end_tokens(result.usage.completion_tokens)
        return result

    def generate_group(self, requests: list[GenerationRequest], on_text: IndexedText,
                       on_logprobs: IndexedLogprobs, should_cancel: CancelCheck) -> list[GenerationResult]:
        """Several choices of one job as one group on the loop (engine.group)."""
        assert self.ctx is not None
        handles = self.rt.engine.loop.submit_group(requests, timeout_s=self.ctx.time_left(),
                                                   should_cancel=should_cancel)
        return self._follow(handles, requests[0].method,
                            lambda started: stream_group(handles, on_text, on_logprobs, should_cancel, started))

    def _follow(self, handles, method: str, consume) -> list[GenerationResult]:
        """Run ``consume(on_start)`` with the job's clock paused until the loop starts the
        request, and ``waiting`` events around a wait longer than ``WAITING_AFTER_S``."""
        ctx = self.ctx
        assert ctx is not None
        ctx.pause_clock()                    # prompt rendering counted; the queue wait is not
        try:
            waited = not handles[0].started.wait(WAITING_AFTER_S)
            if waited:
                ctx.emit(WAITING, {"waiting": True, "method": method})

            def started(at: float) -> None:
                ctx.resume_clock(at)
                if waited:
                    ctx.emit(WAITING, {"waiting": False, "method": method})

            results = consume(started)
        finally:
            ctx.resume_clock()
        if any(h.timed_out for h in handles) and not ctx.stopped_reason:
            ctx.stopped_reason = "timeout"
        return results


def run_generation(ctx: JobContext) -> dict[str, Any]:
    rt = runtime()
    requests = group_from(ctx.record.request, rt.settings.default_max_new_tokens)
    prefix_key = (ctx.record.request.get("routing") or {}).get("prefix_key")
    if prefix_key:  # this worker is about to cache the prompt's prefix: say so (core/routing.py)
        note_prefix(rt.store.client, prefix_key, rt.name, rt.settings.route_ttl_s)
    if len(requests) == 1:
        ctx.record_ids = True
        requests = [continued(rt, ctx, requests[0])]
    generator = WorkerGenerator(rt, ctx)
    try:
        if len(requests) == 1:
            payload = generator.generate(requests[0], on_text=counted(rt, ctx.on_text),
                                         should_cancel=ctx.should_cancel,
                                         on_logprobs=lambda entries: ctx.on_choice_logprobs(0, entries)).to_dict()
        else:
            results = generator.generate_group(requests, counted_choice(rt, ctx.on_choice_text),
                                               ctx.on_choice_logprobs, ctx.should_cancel)
            payload = group_result(results, int(ctx.record.request.get("n") or 1))
    except GrammarError as exc:  # the request's grammar, not the worker, is at fault
        raise JobFailed("grammar_error", str(exc)) from None
    except InsufficientMemoryError as exc:  # official on a GGUF run natively: the MiB it would take
        raise JobFailed("insufficient_memory", str(exc)) from None
    return {**payload, "model": rt.model_id}


def continued(rt: WorkerRuntime, ctx: JobContext, request: GenerationRequest) -> GenerationRequest:
    """A later attempt goes on from what the earlier ones streamed (worker/resume.py)."""
    if ctx.attempt <= 1:
        return request
    resume = streamed_answer(rt.store.events(ctx.job_id), ctx.attempt)
    if resume is None or (request.sampling.logprobs and len(resume.logprobs) != len(resume.ids)):
        return request
    log_event(logger, "job_resumed", job_id=ctx.job_id, attempt=ctx.attempt, tokens=len(resume.ids))
    return replace(request, resume=resume)


def counted_choice(rt: WorkerRuntime, on_text):
    """:func:`counted` for a group's text, tagged with the choice's index."""
    def wrapped(index: int, text: str) -> None:
        on_text(index, text)
        if text:
            rt.token_events += 1
    return wrapped


def counted(rt: WorkerRuntime, on_text):
    """``on_text`` that also counts token events for the heartbeat (a plain int shared by the
    job threads: an increment lost to a race only blurs a rate drawn on a chart)."""
    def wrapped(text: str) -> None:
        on_text(text)
        if text:
            rt.token_events += 1
    return wrapped


def run_agent(ctx: JobContext) -> dict[str, Any]:
    from agent.model import EngineChatModel
    from agent.runner import AgentRunner
    from tools import create_default_registry

    rt = runtime()
    stored = ctx.record.request
    prompt = next(m["content"] for m in reversed(stored["messages"]) if m["role"] == "user")
    model = EngineChatModel(WorkerGenerator(rt, ctx), method=stored.get("method") or BATCHED_METHOD,
                            should_cancel=ctx.should_cancel, priority=rank(stored.get("priority")))
    runner = AgentRunner(model, create_default_registry())
    result = runner.run(prompt, max_steps=stored.get("max_steps"),
                        max_new_tokens=(stored.get("sampling") or {}).get("max_new_tokens"),
                        on_step=lambda step: ctx.emit(TOOL_STEP, step), on_text=ctx.on_text)
    payload = result.to_dict()
    payload["model"] = rt.model_id
    payload["usage"] = {"prompt_tokens": model.prompt_tokens, "completion_tokens": model.completion_tokens}
    if not result.ok:
        raise JobFailed(result.status, result.error or result.status, trace=payload["trace"],
                        outputs=payload["outputs"], usage=payload["usage"])
    return payload


@app.task(name=names.GENERATE, bind=True, throws=TASK_THROWS)
def generate(self: Task, job_id: str, dispatch: int = 0, model: str | None = None) -> dict[str, Any]:
    return run_task(self, job_id, dispatch, run_generation, names.GENERATE, "generation", model)


@app.task(name=names.AGENT, bind=True, throws=TASK_THROWS)
def agent(self: Task, job_id: str, dispatch: int = 0, model: str | None = None) -> dict[str, Any]:
    return run_task(self, job_id, dispatch, run_agent, names.AGENT, "agent", model)


def run_task(task: Task, job_id: str, dispatch: int, body, name: str | None = None,
             base: str | None = None, model: str | None = None) -> dict[str, Any]:
    """Run the attempt (unless the job is for another model: forwarded to ``<base>.<model>``,
    worker/model_guard.py; bench jobs pass no ``base``: any worker runs them), then give Celery
    the job's true end (worker/celery_state.py; a forwarded job is still queued, so this
    delivery is acknowledged and ignored)."""
    rt = runtime()
    ended = None
    if base is None or not forwarded(rt, app, job_id, dispatch, name, base, model):
        ended = run_job(rt, job_id, dispatch, body)
    return report_outcome(task, rt.store, job_id, ended)
