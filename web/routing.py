"""The web's half of cache-aware routing: a prompt's prefix key, and the queue to send it to.

The key is the chained block hash (:mod:`core.prefix_hash`, the block manager's own
function) of the full KV blocks inside the prompt's *system block* -- the rendered system
message, which is a token prefix of every prompt that shares it (engine/prompt.py). Its ids
come from the one rendering and encoding of the request's prompt with its own model's
template and tokenizer (web/prompt_text.py, done for the prompt-length check): no torch, no
model, no second pass. Prompts whose system block is shorter than
``MINISERVE_ROUTE_MIN_PREFIX_TOKENS``, or with no system part, get no key and go to their
model's queue. Only ``generation`` jobs are routed, among the workers of the job's model
(web/models.py).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from flask import current_app
from flask_openapi3 import OpenAPI

from core import routing
from core.prefix_hash import block_hashes, salted_root
from core.settings import Settings
from web.context import EXTENSION_KEY, ctx
from web.prompt_text import PromptCount

ROUTER_KEY = "miniserve_router"


@dataclass(frozen=True)
class PrefixKeyer:
    """Turns a system block's token ids into a prefix key."""

    block_size: int
    min_tokens: int

    @classmethod
    def from_settings(cls, settings: Settings) -> "PrefixKeyer":
        return cls(settings.kv_block_size, settings.route_min_prefix_tokens)

    def key(self, system_ids: list[int] | None, salt: str = "") -> tuple[str | None, int]:
        """(prefix key, tokens it covers); (None, 0) when the prompt has no routable prefix.
        ``salt``: the job's cache scope, so the key is the one its worker's blocks carry."""
        if not system_ids:
            return None, 0
        hashes = block_hashes(system_ids, self.block_size, root=salted_root(salt))
        covered = len(hashes) * self.block_size
        if not hashes or covered < self.min_tokens:
            return None, 0
        return format_key(hashes[-1]), covered


def format_key(block_hash: int) -> str:
    return format(block_hash & 0xFFFF_FFFF_FFFF_FFFF, "016x")


def route_job(request: dict[str, Any], queue: str, model: str | None = None,
              counted: PromptCount | None = None) -> str:
    """The queue to send a job to; counts the decision, and for a prompt with a prefix key
    records it in ``request["routing"]`` (the worker notes the key as held when it starts).
    ``queue`` is the job's model's queue; with ``model`` only that model's workers are
    candidates. ``counted``: the prompt as the length check rendered it with the model's own
    tokenizer (no system block ids there: no key)."""
    if queue != routing.SHARED_QUEUE and not queue.startswith(routing.SHARED_QUEUE + "."):
        return queue
    settings, client = ctx().settings, ctx().store.client
    if not settings.route_by_prefix:
        decision, key, covered = routing.Decision(queue, routing.OFF), None, 0
    else:
        key, covered = current_app.extensions[ROUTER_KEY].key(counted.system_ids if counted else None,
                                                              str(request.get("cache_scope") or ""))
        limits = routing.Limits(ttl_s=settings.route_ttl_s, max_waiting=settings.route_max_waiting)
        decision = routing.choose(client, key, limits, model=model, home=queue)
    if key:
        request["routing"] = routing.describe(decision, key, covered)
    routing.count(client, decision)
    return decision.queue


def register(app: OpenAPI) -> None:
    app.extensions[ROUTER_KEY] = PrefixKeyer.from_settings(app.extensions[EXTENSION_KEY].settings)
