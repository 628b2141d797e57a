"""Prompt length against the request's model's context, checked before a job is enqueued.

The limit is the smaller of the model's context and the workers' paged KV pool (what their
heartbeat-published text says, or ``kv_num_blocks x kv_block_size`` from the shared
settings), so every request the web accepts fits the pool alone and none fails later with an
exhausted pool.

The web holds no model: each model's tokenizer, chat template and context length come from
web/model_texts.py (what its workers published, or the web's own prepared folder). The
prompt is rendered and encoded once (web/prompt_text.py): that count is checked here, and the
same encoding gives the prefix router its system block. Without a template the count is an
upper-bound estimate; without any tokenizer for the model (nothing published yet, no local
folder) a character limit applies, ``MINISERVE_MAX_PROMPT_CHARS``.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import redis

from core.model_source import local_model_dir, model_id
from core.models import seen_models
from core.settings import Settings
import web.prompt_text as prompt_text
from web.errors import ApiError
from web.model_texts import ModelTexts, TextModel
from web.prompt_text import PromptCount

FALLBACK_CONTEXT = 32_768


@dataclass
class PromptBudget:
    """Counts a request's prompt tokens with its own model's tokenizer."""

    texts: ModelTexts
    max_prompt_chars: int
    pool_tokens: int | None = None  # the workers' KV pool, when the settings fix it (no kv_memory_mb)

    @classmethod
    def from_settings(cls, settings: Settings, client: Any) -> "PromptBudget":
        texts = ModelTexts(client, model_id(settings.model), local_model_dir(settings))
        pool = settings.kv_num_blocks * settings.kv_block_size if settings.kv_memory_mb == 0 else None
        return cls(texts, settings.max_prompt_chars, pool)

    def model(self, model: str | None = None) -> TextModel | None:
        """The text side of ``model`` (None: the web's own model), when one is known here."""
        return self.texts.get(model)

    def tokenizer(self, model: str | None = None) -> Any | None:
        """``model``'s ``tokenizers`` Tokenizer, or None when none is known here."""
        found = self.model(model)
        return found.tokenizer if found is not None else None

    def context_length(self, model: str | None = None) -> int:
        found = self.model(model)
        return found.context_length if found is not None else FALLBACK_CONTEXT

    def warm_up(self) -> None:
        """Load the tokenizers of the web's own model and of every model seen in the cluster,
        and compile the own model's template, now (at boot)."""
        try:
            seen = sorted(seen_models(self.texts.client))
        except redis.RedisError:
            seen = []
        self.texts.warm_up(seen)
        found = self.model()
        if found is not None:
            prompt_text.count(found, {"messages": [{"role": "user", "content": "warm-up"}], "prefix": "warm-up"})

    def check(self, request: dict[str, Any], max_new_tokens: int, field_name: str,
              model: str | None = None) -> PromptCount | None:
        """Raise a 422 when the prompt (plus ``max_new_tokens``) cannot fit in ``model``'s
        context; returns the count, or ``None`` when only the character limit was applied."""
        found = self.model(model)
        if found is None:
            chars = sum(len(str(m.get("content") or "")) for m in request.get("messages") or [])
            chars += len(request.get("prefix") or "") + len(request.get("raw_prompt") or "")
            if chars > self.max_prompt_chars:
                raise ApiError(422, "prompt_too_long", f"{field_name}: {chars} characters, more than "
                               f"the limit of {self.max_prompt_chars}", field=field_name)
            return None
        try:
            counted = prompt_text.count(found, request)
        except (TypeError, ValueError):  # text the tokenizer refuses (web.guards stops lone surrogates first)
            raise ApiError(422, "validation_error", f"{field_name}: text the model's tokenizer cannot read",
                           field=field_name) from None
        tokens, context, holder = counted.tokens, found.context_length, "the model's context"
        if self.pool_tokens is not None and self.pool_tokens < context:
            context, holder = self.pool_tokens, "the workers' KV pool (MINISERVE_KV_NUM_BLOCKS x MINISERVE_KV_BLOCK_SIZE)"
        about = "" if counted.exact else "about "
        if tokens >= context:
            raise ApiError(422, "prompt_too_long", f"{field_name}: {about}{tokens} tokens, {holder} "
                           f"holds {context}", field=field_name)
        if tokens + max_new_tokens > context:
            raise ApiError(422, "context_exceeded", f"max_new_tokens: {about}{tokens} prompt tokens + "
                           f"{max_new_tokens} new tokens exceed the {context} tokens {holder} holds; "
                           f"ask for at most {context - tokens}", field="max_new_tokens")
        return counted
