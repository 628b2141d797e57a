"""Turning a validated body into a queued job: normalise, check limits, enqueue by task name.

Order matters: every check that can reject a request (token cap, model, prompt length with
that model's tokenizer, queue depth) runs before anything is written, so a rejected request
leaves no job behind. The prompt is rendered and encoded once here, for the length check and
the prefix router together (web/prompt_text.py).

The stored request is a plain dict the worker turns into ``engine.types.GenerationRequest``::

    {"messages": [{"role": "user", "content": "..."}], "prefix": None | "...",
     "sampling": {"max_new_tokens": 128, "temperature": 0.0, "top_p": 1.0, "top_k": 0,
                  "repetition_penalty": None, "seed": None, "stop": []},
     "method": "official", "tools": None, "max_steps": None, "model": "<model id>"}

(``model``: generation and agent jobs, web/models.py) plus ``"return_token_ids": true`` when the body asked to keep the token ids in the result,
``"speculative": true|false`` when the body set it, and ``"constraint": {"kind", "grammar", "lazy", "start_triggers", "triggers", "trigger_regex"}`` when the body
asked for structured output (``web.constraints``).
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from core import tasks
from core.events import FAILED
from core.jobs import JobRecord
from core.logs import log_event
from core.model_source import EMBEDDING
from core.models import SHARED_QUEUES
from web import constraints
from web.context import ctx, note_job, request_owner
from web.errors import ApiError
from web.logit_bias import bias_pairs
from web.models import pick_model
from web.prompt_text import PromptCount
from web.routing import route_job
from web.schemas import AgentBody, GenerateBody, JobSubmit, SamplingFields

logger = logging.getLogger("miniserve.web.submit")
QUEUE_FULL_RETRY_AFTER_S = 5


@dataclass(frozen=True)
class Submission:
    job_type: str
    request: dict[str, Any]
    input_field: str  # the body field a prompt-length error names
    model: str | None = None  # the body's ``model``; None = the cluster's default (web/models.py)
    queue: str | None = None  # decided by the caller (embedding jobs: their model's queue, web/embeddings)


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
    out = {"max_new_tokens": max_new, "temperature": body.temperature, "top_p": body.top_p,
           "top_k": body.top_k, "repetition_penalty": body.repetition_penalty, "seed": body.seed,
           "stop": stop}
    return {**out, **openai_penalties(body.presence_penalty, body.frequency_penalty, body.logit_bias,
                                      getattr(body, "model", None))}


def openai_penalties(presence: float | None, frequency: float | None,
                     logit_bias: dict[str, float] | None, model: str | None = None) -> dict[str, Any]:
    """OpenAI's penalties and bias for the stored sampling, only when set (a plain job's
    stored request stays as it was)."""
    out: dict[str, Any] = {}
    if presence:
        out["presence_penalty"] = presence
    if frequency:
        out["frequency_penalty"] = frequency
    if logit_bias:
        out["logit_bias"] = bias_pairs(logit_bias, model)  # ids of the named model's vocabulary
    return out


def _request(messages: list[dict[str, str]], prefix: str | None, sampling: dict[str, Any],
             method: str, max_steps: int | None, token_ids: bool = False,
             speculative: bool | None = None, constraint: dict[str, Any] | None = None) -> dict[str, Any]:
    request = {"messages": messages, "prefix": prefix, "sampling": sampling, "method": method,
               "tools": None, "max_steps": max_steps}
    if token_ids:
        request["return_token_ids"] = True  # the worker keeps them in the stored result
    if constraint is not None:
        request["constraint"] = constraint
    return with_speculative(request, speculative)


def with_speculative(request: dict[str, Any], speculative: bool | None) -> dict[str, Any]:
    """The per-request switch is stored only when given (null = the worker's setting)."""
    if speculative is not None:
        request["speculative"] = speculative
    return request


def _constraint(body: SamplingFields) -> dict[str, Any] | None:
    """The body's structured-output request as a checked grammar (``web.constraints``)."""
    found = constraints.for_request(body.format_dict(), body.guided_choice, body.guided_regex)
    return found.to_dict() if found is not None else None


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
    constraint = _constraint(body)
    if constraint is not None and body.type == "agent":
        raise ApiError(422, "validation_error", "response_format: not for agent jobs", field="response_format")
    request = _request(messages, body.prefix, _sampling(body), _method(body), max_steps, body.return_token_ids,
                       body.speculative, constraint)
    return Submission(body.type, request, field_name, body.model)


def from_generate_body(body: GenerateBody) -> Submission:
    messages = [{"role": "user", "content": body.prompt}]
    request = _request(messages, body.prefix, _sampling(body), _method(body), None, body.return_token_ids,
                       body.speculative, _constraint(body))
    return Submission("generate", request, "prompt", body.model)


def from_agent_body(body: AgentBody) -> Submission:
    messages = [{"role": "user", "content": body.prompt}]
    method = ctx().settings.default_generation_method
    return Submission("agent", _request(messages, None, _sampling(body), method, body.max_steps), "prompt",
                      body.model)


def _check_prompt(sub: Submission, model: str | None) -> PromptCount | None:
    """The prompt against ``model``'s context, counted with its tokenizer (web/prompt_budget.py)."""
    if sub.job_type == "embedding":  # no prompt: the embedding worker's tokenizer checks each input
        return None
    max_new = sub.request["sampling"]["max_new_tokens"]
    prompts = sub.request.get("prompts")
    if prompts:  # a text completion's prompts are separate sequences: each must fit
        for text in prompts:
            ctx().budget.check({"raw_prompt": text}, max_new, sub.input_field, model)
        return None
    if sub.job_type == "agent":
        _check_agent_chars(sum(len(m["content"]) for m in sub.request["messages"]), sub.input_field)
    return ctx().budget.check(sub.request, sub.request["sampling"]["max_new_tokens"], sub.input_field, model)


def _check_agent_chars(chars: int, field_name: str) -> None:
    """Agent prompts are capped in characters before any token is counted: a long run of one
    character is few tokens but still has to be read by the agent's prompt analysis."""
    limit = ctx().settings.agent_max_prompt_chars
    if chars > limit:
        raise ApiError(422, "prompt_too_long", f"{field_name}: {chars} characters, more than the agent "
                       f"limit of {limit} (MINISERVE_AGENT_MAX_PROMPT_CHARS)", field=field_name)


def _check_queue_depth(queue: str) -> None:
    limit = ctx().settings.max_queue_depth
    if limit <= 0:
        return
    depth = ctx().store.queue_depths().get(queue, 0)
    if depth >= limit:
        raise ApiError(503, "queue_full", f"queue '{queue}' holds {depth} jobs (limit {limit}); retry later",
                       retry_after=QUEUE_FULL_RETRY_AFTER_S)


def submit(sub: Submission, idempotency_key: str | None = None) -> Submitted:
    """Check, create and enqueue; with an ``Idempotency-Key`` a retry gets the first job back.

    The job (and its key) are created in one atomic step, then its task is sent, then the
    send is confirmed (:meth:`JobStore.mark_dispatched`). A crash in between leaves a queued
    job without a confirmed message: the workers' sweeper re-sends it (``worker/reaper.py``)."""
    queue, model = _queue_and_model(sub)
    counted = _check_prompt(sub, model)
    owner = request_owner() or ""
    store, settings = ctx().store, ctx().settings
    if idempotency_key and (earlier := store.idempotent_job(idempotency_key, owner)) is not None:
        return _replayed(earlier)
    _check_queue_depth(queue)
    target = route_job(sub.request, queue, model, counted)  # cache-aware routing (web/routing.py)
    if idempotency_key:
        job, replayed = store.create_idempotent(sub.job_type, queue, sub.request, idempotency_key=idempotency_key,
                                                owner=owner, max_attempts=settings.max_attempts)
        if replayed:
            return _replayed(job)
    else:
        job = store.create(sub.job_type, queue, sub.request, owner=owner, max_attempts=settings.max_attempts)
    note_job(job.id)
    try:
        ctx().celery.send_task(tasks.TASK_FOR_JOB_TYPE[sub.job_type], args=[job.id], task_id=job.id, queue=target,
                               **({"kwargs": {"model": model}} if model else {}))  # the worker's model guard reads it
    except Exception:
        _abandon(job.id, idempotency_key, owner)
        raise
    _confirm_sent(job.id)
    return Submitted(job, replayed=False)


def _queue_and_model(sub: Submission) -> tuple[str, str | None]:
    """The job's queue, and for generation and agent jobs the model it is for (stored in the
    request, so its worker can check it: worker/model_guard.py); bench jobs take any worker."""
    if sub.queue is not None:
        return sub.queue, sub.request.get("model")
    base = tasks.QUEUE_FOR_JOB_TYPE[sub.job_type]
    if base not in SHARED_QUEUES:
        return base, None
    model, models = pick_model(sub.model)
    if models.kind(model) == EMBEDDING:
        raise ApiError(400, "embedding_model", f"model: '{model}' is an embedding model; it serves "
                       "/v1/embeddings and /api/embed only", field="model")
    sub.request["model"] = model
    return models.queue(base, model), model


def _replayed(job: JobRecord) -> Submitted:
    note_job(job.id)
    return Submitted(job, replayed=True)


def _confirm_sent(job_id: str) -> None:
    """Best effort: when Redis fails right here the sweeper sees a queued job without a
    confirmed message and re-sends it with a new dispatch number (this one becomes stale)."""
    try:
        ctx().store.mark_dispatched(job_id)
    except Exception as exc:  # noqa: BLE001 - the job is queued and its message sent
        log_event(logger, "dispatch_mark_failed", level=logging.WARNING, job_id=job_id, error=type(exc).__name__)


def _abandon(job_id: str, idempotency_key: str | None, owner: str) -> None:
    """The broker refused the task: end the job ``failed`` so it never waits forever. When
    Redis refuses that too, the sweeper finds the job later (logged here)."""
    try:
        ctx().store.finish(job_id, FAILED, {"code": "enqueue_failed", "message": "the task could not be queued"})
        if idempotency_key:
            ctx().store.forget_idempotency(idempotency_key, owner)
    except Exception as exc:  # noqa: BLE001 - Redis is what failed; the sweeper ends the job
        log_event(logger, "job_abandon_failed", level=logging.WARNING, job_id=job_id, error=type(exc).__name__)
