"""A job's way through the fair gate (core/fair_gate.py): its priority class, its key's
queued-jobs and tokens-per-minute limits, and whether its message goes out now or waits its turn."""
from __future__ import annotations

from flask import has_request_context, request

from core.fair_gate import FairGate, release_queues
from core.owners import by_owner
from core.priorities import DEFAULT, INTERACTIVE, capped, rank
from core.token_rate import TokenRate
from web.context import ctx
from web.errors import ApiError

EVERYONE = "-"  # the owner the gate counts when MINISERVE_API_KEYS is empty: everyone is one key
QUEUED_LIMIT_RETRY_AFTER_S = 5


def gate() -> FairGate:
    return FairGate.from_settings(ctx().store.client, ctx().settings)


def surface_default() -> str:
    """Clients of ``/v1`` and ``/api`` (OpenAI, Anthropic, Ollama) are people waiting on an
    answer; ``/jobs``, ``/generate`` and ``/agent/run`` are submit-and-poll."""
    path = request.path if has_request_context() else ""
    return INTERACTIVE if path.startswith(("/v1/", "/api/")) else DEFAULT


def job_priority(asked: str | None, owner: str) -> str:
    """The class the job runs in: the one it asked for, or its surface's default lowered to
    the key's cap. Asking above the cap is a 403 naming ``priority``."""
    cap = by_owner(ctx().settings.key_priority_caps).get(owner) if owner else None
    if asked is None:
        return capped(surface_default(), cap)
    if cap is not None and rank(asked) < rank(cap):
        raise ApiError(403, "priority_not_allowed", f"priority: this key may ask for '{cap}' or a lower class, "
                       f"not '{asked}' (MINISERVE_KEY_PRIORITY_CAPS)", field="priority")
    return asked


def check_queued_limit(owner_key: str) -> None:
    """At most ``MINISERVE_KEY_MAX_QUEUED`` jobs of one key wait at once (429 beyond)."""
    limit = ctx().settings.key_max_queued
    if limit <= 0:
        return
    queued = gate().queued_by(owner_key)
    if queued >= limit:
        raise ApiError(429, "too_many_queued", f"this key has {queued} jobs waiting (limit {limit}, "
                       "MINISERVE_KEY_MAX_QUEUED); retry when some have started",
                       retry_after=QUEUED_LIMIT_RETRY_AFTER_S)


def charge_tokens(owner_key: str, cost: int) -> None:
    """A key's jobs of the last minute may cost at most ``MINISERVE_KEY_TOKENS_PER_MINUTE``
    tokens (core/token_rate.py): beyond, a 429 with ``Retry-After``; a request that alone
    costs more, a 400 naming its token cap."""
    limit = ctx().settings.key_tokens_per_minute
    if limit <= 0:
        return
    if cost > limit:
        field = "max_tokens" if surface_default() == INTERACTIVE else "max_new_tokens"
        raise ApiError(400, "request_too_large", f"{field}: this request may cost {cost} tokens (prompt plus "
                       f"the tokens it may generate), more than this key's {limit} per minute "
                       "(MINISERVE_KEY_TOKENS_PER_MINUTE)", field=field)
    charged = TokenRate(ctx().store.client, limit).charge(owner_key, cost)
    if not charged.admitted:
        raise ApiError(429, "tokens_per_minute_exceeded", f"this key was charged {int(charged.used)} tokens in "
                       f"the last minute; this request needs {cost} more (limit {limit}, "
                       "MINISERVE_KEY_TOKENS_PER_MINUTE)", retry_after=charged.retry_after_s)


def release(queue: str) -> None:
    """Send the messages of ``queue``'s held jobs whose turn came (best effort: a worker's
    next start, or its reaper's next tick, releases them otherwise)."""
    release_queues(gate(), ctx().store, ctx().celery, [queue])
