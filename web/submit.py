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

(``model``: generation and agent jobs, web/models.py); ``sampling`` also carries every other
knob of ``core.sampling_fields`` the body set (``job_sampling``); plus ``"return_token_ids": true`` when the body asked to keep the token ids in the result,
``"speculative": true|false`` when the body set it, and ``"constraint": {"kind", "grammar", "lazy", "start_triggers", "triggers", "trigger_regex"}`` when the body
asked for structured output (``web.constraints``).
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any

from flask import has_request_context, request

from core import tasks, webhook_target
from core.events import FAILED
from core.jobs import JobRecord
from core.logs import log_event
from core.webhooks import default_url_for, secret_for
from core.model_source import EMBEDDING
from core.models import SHARED_QUEUES
from core.prefix_hash import cache_scope
from web import admission, constraints
from web.context import ctx, note_job, request_owner
from web.errors import ApiError
from web.logit_bias import bias_pairs
from web.models import pick_model
from web.prompt_text import PromptCount
from web.routing import route_job
from web.sampling_base import SamplingBase, stop_list, stored_knobs
from web.schemas import AgentBody, GenerateBody, JobSubmit, SamplingFields

logger = logging.getLogger("miniserve.web.submit")
MAX_IDEMPOTENCY_KEY = 200  # characters, as /jobs' schema declares
QUEUE_FULL_RETRY_AFTER_S = 5


@dataclass(frozen=True)
class Options:
    """A job's deadline (unix seconds) and webhook, checked (:func:`job_options`)."""

    deadline: float | None = None
    webhook_url: str | None = None


@dataclass(frozen=True)
class Submission:
    job_type: str
    request: dict[str, Any]
    input_field: str  # the body field a prompt-length error names
    model: str | None = None  # the body's ``model``; None = the cluster's default (web/models.py)
    options: Options = Options()
    queue: str | None = None  # decided by the caller (embedding jobs: their model's queue, web/embeddings)


def job_options(deadline: float | None = None, timeout_s: float | None = None,
                webhook_url: str | None = None, *, now: float | None = None) -> Options:
    """The body's ``deadline`` / ``timeout_s`` as one deadline, and its ``webhook_url`` (or the
    key's default one) checked against the target rules; a 400 naming the field otherwise."""
    now = time.time() if now is None else now
    settings = ctx().settings
    if deadline is not None and timeout_s is not None:
        raise ApiError(400, "validation_error", "timeout_s: give deadline or timeout_s, not both", field="timeout_s")
    name = "timeout_s" if timeout_s is not None else "deadline"
    if timeout_s is not None:
        deadline = now + timeout_s
    if deadline is not None and deadline <= now:
        raise ApiError(400, "validation_error", f"deadline: {deadline} (unix seconds) has already passed",
                       field="deadline")
    if deadline is not None and deadline - now > settings.job_ttl_s:
        raise ApiError(400, "validation_error", f"{name}: more than MINISERVE_JOB_TTL_S "
                       f"({settings.job_ttl_s} s) ahead; the job's record would expire first", field=name)
    return Options(deadline, _webhook(webhook_url))


def _webhook(url: str | None) -> str | None:
    owner = request_owner() or ""
    url = url if url is not None else default_url_for(ctx().settings, owner)
    if url is None:
        return None
    if not secret_for(ctx().settings, owner):
        raise ApiError(400, "invalid_webhook_url", "webhook_url: no webhook secret is configured for this key "
                       "(MINISERVE_WEBHOOK_SECRET or MINISERVE_WEBHOOK_SECRETS)", field="webhook_url")
    try:
        webhook_target.check(url, ctx().settings.webhook_allow_hosts)
    except webhook_target.TargetRefused as exc:
        raise ApiError(400, "invalid_webhook_url", f"webhook_url: {exc}", field="webhook_url") from None
    return url


@dataclass(frozen=True)
class Submitted:
    job: JobRecord
    replayed: bool  # True: an Idempotency-Key matched an earlier submission


def job_sampling(body: SamplingBase, max_tokens: int | None, cap_field: str,
                 model: str | None = None) -> dict[str, Any]:
    """The stored sampling of any surface's body (its one conversion function calls this):
    the token cap checked (a 422 naming ``cap_field``, the surface's own name for it), the
    shared knobs (``web.sampling_base.stored_knobs``), stop strings and the bias as token ids
    of ``model``'s vocabulary."""
    out = {"max_new_tokens": _max_new(max_tokens, cap_field), **stored_knobs(body), "stop": stop_list(body)}
    if body.logit_bias:
        out["logit_bias"] = bias_pairs(body.logit_bias, model or None)  # ids of the named model's vocabulary
    return out


def _max_new(max_tokens: int | None, cap_field: str) -> int:
    settings = ctx().settings
    max_new = max_tokens or settings.default_max_new_tokens
    if max_new > settings.max_new_tokens_cap:
        raise ApiError(422, "validation_error", f"{cap_field}: at most {settings.max_new_tokens_cap}",
                       field=cap_field)
    return max_new


def _agent_sampling(body: AgentBody) -> dict[str, Any]:
    """Agent runs are greedy, with the model's repetition penalty."""
    return {"max_new_tokens": _max_new(body.max_new_tokens, "max_new_tokens"), "temperature": 0.0, "top_p": 1.0,
            "top_k": 0, "repetition_penalty": None, "seed": None, "stop": []}


def _request(messages: list[dict[str, str]], prefix: str | None, sampling: dict[str, Any],
             method: str, max_steps: int | None, token_ids: bool = False,
             speculative: bool | None = None, constraint: dict[str, Any] | None = None,
             cache_salt: str | None = None, priority: str | None = None) -> dict[str, Any]:
    request = {"messages": messages, "prefix": prefix, "sampling": sampling, "method": method,
               "tools": None, "max_steps": max_steps}
    if token_ids:
        request["return_token_ids"] = True  # the worker keeps them in the stored result
    if constraint is not None:
        request["constraint"] = constraint
    return with_speculative(request, speculative, cache_salt, priority)


def with_speculative(request: dict[str, Any], speculative: bool | None, cache_salt: str | None = None,
                     priority: str | None = None) -> dict[str, Any]:
    """The per-request switches, stored only when given (null = the worker's setting); a
    ``cache_salt`` joins the key's cache scope at submit (:func:`submit`), and a ``priority``
    is checked against the key's cap there (null: the surface's default)."""
    if speculative is not None:
        request["speculative"] = speculative
    if cache_salt is not None:
        request["cache_salt"] = cache_salt
    if priority is not None:
        request["priority"] = priority
    return request


def _constraint(body: SamplingFields) -> dict[str, Any] | None:
    """The body's structured-output request as a checked grammar (``web.constraints``)."""
    found = constraints.for_request(body.format_dict(), body.guided_choice, body.guided_regex)
    return found.to_dict() if found is not None else None


def job_method(body: SamplingBase) -> str:
    """The body's generation method, or the service default."""
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
    request = _request(messages, body.prefix, job_sampling(body, body.max_new_tokens, "max_new_tokens", body.model),
                       job_method(body), max_steps, body.return_token_ids,
                       body.speculative, constraint, body.cache_salt, body.priority)
    return Submission(body.type, request, field_name, body.model,
                      job_options(body.deadline, body.timeout_s, body.webhook_url))


def from_generate_body(body: GenerateBody) -> Submission:
    messages = [{"role": "user", "content": body.prompt}]
    request = _request(messages, body.prefix, job_sampling(body, body.max_new_tokens, "max_new_tokens", body.model),
                       job_method(body), None, body.return_token_ids,
                       body.speculative, _constraint(body), body.cache_salt, body.priority)
    return Submission("generate", request, "prompt", body.model)


def from_agent_body(body: AgentBody) -> Submission:
    messages = [{"role": "user", "content": body.prompt}]
    method = ctx().settings.default_generation_method
    request = _request(messages, None, _agent_sampling(body), method, body.max_steps, priority=body.priority)
    return Submission("agent", request, "prompt",
                      body.model, job_options(body.deadline, body.timeout_s, body.webhook_url))


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


def _possible_tokens(sub: Submission, counted: PromptCount | None) -> int:
    """What a job may cost, as the tokens-per-minute limit charges it: its counted prompt
    tokens plus the tokens each of its sequences may generate."""
    sequences = max(1, len(sub.request.get("prompts") or ())) * max(1, int(sub.request.get("n") or 1))
    max_new = int((sub.request.get("sampling") or {}).get("max_new_tokens") or 0)
    return (counted.tokens if counted is not None else 0) + sequences * max_new


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
    idempotency_key = idempotency_key or _idempotency_header()
    queue, model = _queue_and_model(sub)
    counted = _check_prompt(sub, model)
    owner = request_owner() or ""
    store, settings = ctx().store, ctx().settings
    if idempotency_key and (earlier := store.idempotent_job(idempotency_key, owner)) is not None:
        return _replayed(earlier)
    sub.request["priority"] = admission.job_priority(sub.request.get("priority"), owner)
    gate_owner = owner or admission.EVERYONE
    admission.check_queued_limit(gate_owner)
    _check_queue_depth(queue)
    admission.charge_tokens(gate_owner, _possible_tokens(sub, counted))
    scope = cache_scope(owner, settings.share_prefix_cache_across_keys, str(sub.request.pop("cache_salt", "") or ""))
    if scope:  # the prefix cache's salt: this key's blocks serve only this key (core/prefix_hash.py)
        sub.request["cache_scope"] = scope
    target = route_job(sub.request, queue, model, counted)  # cache-aware routing (web/routing.py)
    if idempotency_key:
        job, replayed = store.create_idempotent(sub.job_type, queue, sub.request, idempotency_key=idempotency_key,
                                                owner=owner, max_attempts=settings.max_attempts,
                                                deadline=sub.options.deadline, webhook_url=sub.options.webhook_url)
        if replayed:
            return _replayed(job)
    else:
        job = store.create(sub.job_type, queue, sub.request, owner=owner, max_attempts=settings.max_attempts,
                           deadline=sub.options.deadline, webhook_url=sub.options.webhook_url)
    note_job(job.id)
    gated = target == queue  # a job routed to one worker's own queue does not pass the gate
    if gated and admission.gate().admit(job.id, queue, sub.request["priority"], gate_owner) != 1:
        admission.release(queue)  # held (the line may have drained meanwhile), or already ended
        return Submitted(job, replayed=False)
    try:
        ctx().celery.send_task(tasks.TASK_FOR_JOB_TYPE[sub.job_type], args=[job.id], task_id=job.id, queue=target,
                               **({"kwargs": {"model": model}} if model else {}))  # the worker's model guard reads it
    except Exception:
        _abandon(job.id, idempotency_key, owner)
        raise
    _confirm_sent(job.id, None if gated else target)  # the gate's admission joined the line
    return Submitted(job, replayed=False)


def _idempotency_header() -> str | None:
    """The request's ``Idempotency-Key`` on every surface (``/jobs`` declares it in its schema;
    ``/v1``, ``/api`` and the Anthropic route read it here): a retried request with the same key
    gets the first job back, its answer or its stream replayed."""
    if not has_request_context():
        return None
    key = request.headers.get("Idempotency-Key")
    if key is not None and not 0 < len(key) <= MAX_IDEMPOTENCY_KEY:
        raise ApiError(400, "invalid_idempotency_key", f"Idempotency-Key: 1 to {MAX_IDEMPOTENCY_KEY} characters",
                       field="Idempotency-Key")
    return key


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


def _confirm_sent(job_id: str, queue: str | None) -> None:
    """Best effort: when Redis fails right here the sweeper sees a queued job without a
    confirmed message and re-sends it with a new dispatch number (this one becomes stale)."""
    try:
        ctx().store.mark_dispatched(job_id, queue)
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
