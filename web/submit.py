"""Turning a validated body into a queued job: normalise, check limits, enqueue by task name.

Order matters: every check that can reject a request (token cap, prompt length, queue
depth) runs before anything is written, so a rejected request leaves no job behind.

The stored request is a plain dict the worker turns into ``engine.types.GenerationRequest``::

    {"messages": [{"role": "user", "content": "..."}], "prefix": None | "...",
     "sampling": {"max_new_tokens": 128, "temperature": 0.0, "top_p": 1.0, "top_k": 0,
                  "repetition_penalty": None, "seed": None, "stop": []},
     "method": "official", "tools": None, "max_steps": None}
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from core import keys, tasks
from core.events import FAILED
from core.jobs import JobNotFound, JobRecord, new_job_id
from web.context import ctx, note_job, request_owner
from web.errors import ApiError
from web.routing import route_job
from web.schemas import AgentBody, GenerateBody, JobSubmit, SamplingFields

QUEUE_FULL_RETRY_AFTER_S = 5
IDEMPOTENT_WAIT_S = 2.0


@dataclass(frozen=True)
class Submission:
    job_type: str
    request: dict[str, Any]
    input_field: str  # the body field a prompt-length error names


@dataclass(frozen=True)
class Submitted:
    job: JobRecord
    replayed: bool  # True: an Idempotency-Key matched an earlier submission


def _sampling(body: SamplingFields | AgentBody) -> dict[str, Any]:
    settings = ctx().settings
    max_new = body.max_new_tokens or settings.default_max_new_tokens
    if max_new > settings.max_new_tokens_cap:
        raise ApiError(422, "validation_error", f"max_new_tokens: at most {settings.max_new_tokens_cap}",
                       field="max_new_tokens")
    if isinstance(body, AgentBody):
        return {"max_new_tokens": max_new, "temperature": 0.0, "top_p": 1.0, "top_k": 0,
                "repetition_penalty": None, "seed": None, "stop": []}
    stop = [body.stop] if isinstance(body.stop, str) else list(body.stop or [])
    return {"max_new_tokens": max_new, "temperature": body.temperature, "top_p": body.top_p,
            "top_k": body.top_k, "repetition_penalty": body.repetition_penalty, "seed": body.seed,
            "stop": stop}


def _request(messages: list[dict[str, str]], prefix: str | None, sampling: dict[str, Any],
             method: str, max_steps: int | None) -> dict[str, Any]:
    return {"messages": messages, "prefix": prefix, "sampling": sampling, "method": method,
            "tools": None, "max_steps": max_steps}


def _method(body: SamplingFields) -> str:
    return body.generation_method or ctx().settings.default_generation_method


def from_job_body(body: JobSubmit) -> Submission:
    if body.messages is not None:
        messages = [m.model_dump() for m in body.messages]
        field_name = "messages"
    else:
        messages = [{"role": "user", "content": body.prompt or ""}]
        field_name = "prompt"
    if body.system is not None:
        messages.insert(0, {"role": "system", "content": body.system})
    max_steps = (body.max_steps or 3) if body.type == "agent" else None
    request = _request(messages, body.prefix, _sampling(body), _method(body), max_steps)
    return Submission(body.type, request, field_name)


def from_generate_body(body: GenerateBody) -> Submission:
    messages = [{"role": "user", "content": body.prompt}]
    return Submission("generate", _request(messages, body.prefix, _sampling(body), _method(body), None),
                      "prompt")


def from_agent_body(body: AgentBody) -> Submission:
    messages = [{"role": "user", "content": body.prompt}]
    method = ctx().settings.default_generation_method
    return Submission("agent", _request(messages, None, _sampling(body), method, body.max_steps), "prompt")


def _check_prompt(sub: Submission) -> None:
    texts = [m["content"] for m in sub.request["messages"]]
    if sub.request["prefix"]:
        texts.append(sub.request["prefix"])
    ctx().budget.check(texts, sub.request["sampling"]["max_new_tokens"], sub.input_field)


def _check_queue_depth(queue: str) -> None:
    limit = ctx().settings.max_queue_depth
    if limit <= 0:
        return
    depth = ctx().store.queue_depths().get(queue, 0)
    if depth >= limit:
        raise ApiError(503, "queue_full", f"queue '{queue}' holds {depth} jobs (limit {limit}); retry later",
                       retry_after=QUEUE_FULL_RETRY_AFTER_S)


def _replayed_job(idem_key: str, owner: str | None) -> JobRecord | None:
    """The job an earlier submission with this key created (waits briefly if it is being created)."""
    deadline = time.monotonic() + IDEMPOTENT_WAIT_S
    while True:
        job_id = ctx().store.client.get(idem_key)
        if job_id is None:
            return None  # the key expired between SET NX and GET: treat as new
        try:
            return ctx().store.get(job_id, owner=owner)
        except JobNotFound:
            if time.monotonic() > deadline:
                raise ApiError(409, "idempotency_conflict", "a submission with this Idempotency-Key "
                               "is still being created; retry", retry_after=1) from None
            time.sleep(0.05)


def submit(sub: Submission, idempotency_key: str | None = None) -> Submitted:
    """Check, create and enqueue; with an ``Idempotency-Key`` a retry gets the first job back."""
    _check_prompt(sub)
    queue = tasks.QUEUE_FOR_JOB_TYPE[sub.job_type]
    owner = request_owner()
    store, settings = ctx().store, ctx().settings
    job_id, idem_key = new_job_id(), None
    if idempotency_key:
        idem_key = keys.idempotency_key(owner or "-", idempotency_key)
        while not store.client.set(idem_key, job_id, nx=True, ex=settings.job_ttl_s):
            earlier = _replayed_job(idem_key, owner)
            if earlier is not None:
                note_job(earlier.id)
                return Submitted(earlier, replayed=True)
    try:
        _check_queue_depth(queue)
        target = route_job(sub.request, queue)  # cache-aware routing (web/routing.py)
        job = store.create(sub.job_type, queue, sub.request, owner=owner or "",
                           max_attempts=settings.max_attempts, job_id=job_id)
    except Exception:
        if idem_key:
            _forget(idem_key)
        raise
    note_job(job.id)
    try:
        ctx().celery.send_task(tasks.TASK_FOR_JOB_TYPE[sub.job_type], args=[job.id], task_id=job.id, queue=target)
    except Exception:
        _abandon(job.id, idem_key)
        raise
    return Submitted(job, replayed=False)


def _forget(idem_key: str) -> None:
    try:
        ctx().store.client.delete(idem_key)
    except Exception:  # Redis is what failed; the key expires on its own
        pass


def _abandon(job_id: str, idem_key: str | None) -> None:
    """The broker refused the task: end the job ``failed`` so it never waits forever."""
    try:
        ctx().store.finish(job_id, FAILED, {"code": "enqueue_failed", "message": "the task could not be queued"})
    except Exception:
        pass
    if idem_key:
        _forget(idem_key)
