"""The web's half of cache-aware routing: a prompt's prefix key, and the queue to send it to.

The key is the chained block hash (:mod:`core.prefix_hash`, the block manager's own
function) of the full KV blocks inside the prompt's *system block* -- the rendered system
message, which is a token prefix of every prompt that shares it (engine/prompt.py). The
web renders it with the model's chat template (web/chat_template.py: jinja2, as transformers does) and counts
tokens with the ``tokenizers`` library: no torch, no model. Prompts whose system block is
shorter than ``MINISERVE_ROUTE_MIN_PREFIX_TOKENS``, or with no system part, get no key and
go to their model's queue. Only ``generation`` jobs are routed, among the workers of the
job's model (web/models.py).
"""
from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from flask import current_app
from flask_openapi3 import OpenAPI

from core import routing
from core.logs import log_event
from core.prefix_hash import block_hashes
from core.settings import Settings
from web.context import EXTENSION_KEY, ctx
from web.chat_template import load_chat_template
from web.tokenizer import load_tokenizer
from core.model_source import local_model_dir as model_folder

logger = logging.getLogger("miniserve.web.routing")
ROUTER_KEY = "miniserve_router"
USER_MARKER = "<|im_start|>user"


@dataclass
class PrefixKeyer:
    """Computes prefix keys; loads the tokenizer and chat template once, lazily."""

    folder: Path | None
    block_size: int
    min_tokens: int
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    _loaded: bool = field(default=False, repr=False)
    _tokenizer: Any = field(default=None, repr=False)
    _template: Any = field(default=None, repr=False)

    @classmethod
    def from_settings(cls, settings: Settings) -> "PrefixKeyer":
        return cls(model_folder(settings), settings.kv_block_size, settings.route_min_prefix_tokens)

    def _load(self) -> None:
        with self._lock:
            if self._loaded:
                return
            self._loaded = True
            template = load_chat_template(self.folder)
            tokenizer = load_tokenizer(self.folder)
            if template is None or tokenizer is None:
                return
            self._template = template
            self._tokenizer = tokenizer

    def system_ids(self, request: dict[str, Any]) -> list[int] | None:
        """Token ids of the rendered system block, exactly as engine/prompt.py cuts them."""
        self._load()
        messages = request.get("messages") or []
        system = request.get("prefix")
        if system is None and messages and messages[0].get("role") == "system":
            system = messages[0].get("content")
        if system is None or self._template is None:
            return None
        probe = [{"role": "system", "content": system}, {"role": "user", "content": "x"}]
        text = self._template.render(messages=probe, tools=None, add_generation_prompt=False)
        cut = text.find(USER_MARKER)
        if cut <= 0:
            return None
        return list(self._tokenizer.encode(text[:cut], add_special_tokens=False).ids)

    def key(self, request: dict[str, Any]) -> tuple[str | None, int]:
        """(prefix key, tokens it covers); (None, 0) when the prompt has no routable prefix.
        Routing is an optimisation: a prompt the template or tokenizer cannot handle is
        simply not routed (the worker reports any real problem with it)."""
        try:
            ids = self.system_ids(request)
        except Exception as exc:  # noqa: BLE001 - never fail a submission over its routing key
            log_event(logger, "routing_key_failed", level=logging.WARNING, error=type(exc).__name__)
            return None, 0
        if not ids:
            return None, 0
        hashes = block_hashes(ids, self.block_size)
        covered = len(hashes) * self.block_size
        if not hashes or covered < self.min_tokens:
            return None, 0
        return format_key(hashes[-1]), covered


def format_key(block_hash: int) -> str:
    return format(block_hash & 0xFFFF_FFFF_FFFF_FFFF, "016x")


def route_job(request: dict[str, Any], queue: str, model: str | None = None) -> str:
    """The queue to send a job to; counts the decision, and for a prompt with a prefix key
    records it in ``request["routing"]`` (the worker notes the key as held when it starts).
    ``queue`` is the job's model's queue; with ``model`` only that model's workers are
    candidates. The key comes from the web's tokenizer whatever the model: for another model
    it is still the same key for the same system prompt, which is all routing needs."""
    if queue != routing.SHARED_QUEUE and not queue.startswith(routing.SHARED_QUEUE + "."):
        return queue
    settings, client = ctx().settings, ctx().store.client
    if not settings.route_by_prefix:
        decision, key, covered = routing.Decision(queue, routing.OFF), None, 0
    else:
        key, covered = current_app.extensions[ROUTER_KEY].key(request)
        limits = routing.Limits(ttl_s=settings.route_ttl_s, max_waiting=settings.route_max_waiting)
        decision = routing.choose(client, key, limits, model=model, home=queue)
    if key:
        request["routing"] = routing.describe(decision, key, covered)
    routing.count(client, decision)
    return decision.queue


def register(app: OpenAPI) -> None:
    app.extensions[ROUTER_KEY] = PrefixKeyer.from_settings(app.extensions[EXTENSION_KEY].settings)
