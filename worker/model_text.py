"""This worker's model text side (tokenizer, chat template, limits), published for the web.

Read from the loaded model itself, so the web counts and renders with exactly what the
worker encodes with: the fast tokenizer's own ``tokenizer.json`` (its backend), the chat
template it renders, the special tokens the template may use, and the context length.
"""
from __future__ import annotations

from typing import Any

from core.model_text import ModelText

FALLBACK_CONTEXT = 32_768  # as web/prompt_budget.py assumes for a config without the field


def model_text(loaded: Any) -> ModelText | None:
    """The loaded model's text side; None for a tokenizer without a ``tokenizer.json`` form."""
    tokenizer = loaded.tokenizer
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        return None
    template = getattr(tokenizer, "chat_template", None)
    config = getattr(loaded.model, "config", None)
    context = int(getattr(config, "max_position_embeddings", 0) or FALLBACK_CONTEXT)
    special = {name: value for name, value in (getattr(tokenizer, "special_tokens_map", None) or {}).items()
               if isinstance(value, str)}
    return ModelText(tokenizer_json=backend.to_str(), chat_template=template if isinstance(template, str) else None,
                     context_length=context, special_tokens=special)
