"""This worker's model text side (tokenizer, chat template, limits), published for the web.

Read from the loaded model itself, so the web counts and renders with exactly what the
worker encodes with: the fast tokenizer's own ``tokenizer.json`` (its backend), the chat
template it renders, the special tokens the template may use, and the context length: the
model's own, or the paged KV pool's capacity when that is smaller, so the web refuses up front
what the pool could never hold (a request either fits or gets a 4xx naming the limit; it never
fails later with an exhausted pool).
"""
from __future__ import annotations

from typing import Any

from core.model_text import ModelText
from core.settings import Settings
from engine.batching.scheduler import pool_blocks
from engine.paged.pool import KVGeometry

FALLBACK_CONTEXT = 32_768  # as web/prompt_budget.py assumes for a config without the field


def pool_tokens(settings: Settings, loaded: Any) -> int:
    """Tokens the paged KV pool of this model holds (``kv_num_blocks`` or ``kv_memory_mb``)."""
    config = loaded.model.config
    heads = config.num_attention_heads
    geometry = KVGeometry(config.num_hidden_layers, getattr(config, "num_key_value_heads", None) or heads,
                          getattr(config, "head_dim", None) or config.hidden_size // heads)
    return pool_blocks(settings, geometry, loaded.dtype) * settings.kv_block_size


def model_text(loaded: Any, pool_capacity: int | None = None) -> ModelText | None:
    """The loaded model's text side; None for a tokenizer without a ``tokenizer.json`` form.
    ``pool_capacity``: the KV pool's tokens, which caps the published context."""
    tokenizer = loaded.tokenizer
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        return None
    template = getattr(tokenizer, "chat_template", None)
    config = getattr(loaded.model, "config", None)
    context = int(getattr(config, "max_position_embeddings", 0) or FALLBACK_CONTEXT)
    if pool_capacity:
        context = min(context, pool_capacity)
    special = {name: value for name, value in (getattr(tokenizer, "special_tokens_map", None) or {}).items()
               if isinstance(value, str)}
    return ModelText(tokenizer_json=backend.to_str(), chat_template=template if isinstance(template, str) else None,
                     context_length=context, special_tokens=special)
