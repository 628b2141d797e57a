"""Prompt length against the model's context, checked before a job is enqueued.

The web holds no model: it loads only ``tokenizer.json`` with the ``tokenizers`` library
(fast, no torch) and reads ``max_position_embeddings`` from ``config.json``. When the
prepared model folder has no tokenizer file (model not prepared yet, or a Hugging Face id
not downloaded here), it falls back to a character limit, ``MINISERVE_MAX_PROMPT_CHARS``.

The count is an upper-bound estimate of the templated prompt: the text's tokens plus
:data:`PER_MESSAGE_TOKENS` per message for the chat template's role markers, plus
:data:`TEMPLATE_TOKENS` for the default system prompt and the assistant header.
"""
from __future__ import annotations

import json
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from core.model_source import local_model_dir
from core.settings import Settings
from web.errors import ApiError
from web.tokenizer import load_tokenizer

PER_MESSAGE_TOKENS = 8
TEMPLATE_TOKENS = 48
FALLBACK_CONTEXT = 32_768


@dataclass
class PromptBudget:
    """Counts prompt tokens with the model's own tokenizer (loaded once, lazily)."""

    folder: Path | None
    max_prompt_chars: int
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    _loaded: bool = field(default=False, repr=False)
    _tokenizer: Any = field(default=None, repr=False)
    _context: int = field(default=FALLBACK_CONTEXT, repr=False)

    @classmethod
    def from_settings(cls, settings: Settings) -> "PromptBudget":
        return cls(local_model_dir(settings), settings.max_prompt_chars)

    def _load(self) -> None:
        with self._lock:
            if self._loaded:
                return
            self._tokenizer = load_tokenizer(self.folder)
            if self._tokenizer is not None:
                self._context = _context_length(self.folder / "config.json")
            self._loaded = True

    @property
    def uses_tokenizer(self) -> bool:
        self._load()
        return self._tokenizer is not None

    @property
    def context_length(self) -> int:
        self._load()
        return self._context

    def check(self, texts: list[str], max_new_tokens: int, field_name: str) -> int | None:
        """Raise a 422 when the prompt (plus ``max_new_tokens``) cannot fit; returns the
        estimated prompt tokens, or ``None`` when only the character limit was applied."""
        self._load()
        if self._tokenizer is None:
            chars = sum(len(text) for text in texts)
            if chars > self.max_prompt_chars:
                raise ApiError(422, "prompt_too_long", f"{field_name}: {chars} characters, more than "
                               f"the limit of {self.max_prompt_chars}", field=field_name)
            return None
        encodings = self._tokenizer.encode_batch(texts, add_special_tokens=False)
        tokens = sum(len(e.ids) for e in encodings) + PER_MESSAGE_TOKENS * len(texts) + TEMPLATE_TOKENS
        if tokens >= self._context:
            raise ApiError(422, "prompt_too_long", f"{field_name}: about {tokens} tokens, the model's "
                           f"context holds {self._context}", field=field_name)
        if tokens + max_new_tokens > self._context:
            raise ApiError(422, "context_exceeded", f"max_new_tokens: about {tokens} prompt tokens + "
                           f"{max_new_tokens} new tokens exceed the context of {self._context}; "
                           f"ask for at most {self._context - tokens}", field="max_new_tokens")
        return tokens


def _context_length(config_file: Path) -> int:
    try:
        config = json.loads(config_file.read_text(encoding="utf-8"))
        return int(config.get("max_position_embeddings") or FALLBACK_CONTEXT)
    except (OSError, ValueError, TypeError):
        return FALLBACK_CONTEXT
