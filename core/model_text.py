"""A model's text side, as the web needs it to count and render prompts without the model.

Each worker publishes its model's ``tokenizer.json``, chat template, special tokens and
context length under its model id once the model has loaded (worker/runtime.py); the web
loads it lazily per model id (web/model_texts.py, with the ``tokenizers`` library and
jinja2: no torch). So with several models per cluster, ``/tokenize``, the prompt-length
check and the prefix router use the tokenizer of the request's model, exactly the one its
worker uses. The key lives as long as the model is remembered (``core.models.KNOWN_FOR_S``),
refreshed by its workers' heartbeats; a worker rewrites it only when its digest changed.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field

import redis

from core import keys

TTL_S = 2 * 24 * 3600  # past core.models.KNOWN_FOR_S: a forgotten model's text goes too


@dataclass(frozen=True)
class ModelText:
    tokenizer_json: str
    chat_template: str | None
    context_length: int
    special_tokens: dict[str, str] = field(default_factory=dict)  # bos_token, eos_token, ... (template variables)

    @property
    def digest(self) -> str:
        parts = [self.tokenizer_json, self.chat_template or "", str(self.context_length),
                 json.dumps(self.special_tokens, sort_keys=True)]
        return hashlib.sha256("\0".join(parts).encode("utf-8", errors="surrogatepass")).hexdigest()

    def to_redis(self) -> dict[str, str]:
        return {"tokenizer": self.tokenizer_json, "template": self.chat_template or "",
                "context_length": str(self.context_length), "special_tokens": json.dumps(self.special_tokens),
                "digest": self.digest}

    @classmethod
    def from_redis(cls, raw: dict[str, str]) -> "ModelText":
        return cls(tokenizer_json=raw["tokenizer"], chat_template=raw.get("template") or None,
                   context_length=int(raw["context_length"]),
                   special_tokens=json.loads(raw.get("special_tokens") or "{}"))


def publish(client: redis.Redis, model_id: str, text: ModelText, ttl_s: int = TTL_S) -> bool:
    """Store ``text`` under ``model_id`` unless the same one is there; True when written."""
    key = keys.model_text_key(model_id)
    current = client.hget(key, "digest")
    if current is not None and _text(current) == text.digest:
        client.expire(key, ttl_s)
        return False
    pipe = client.pipeline(transaction=True)
    pipe.delete(key)
    pipe.hset(key, mapping=text.to_redis())
    pipe.expire(key, ttl_s)
    pipe.execute()
    return True


def refresh(client: redis.Redis, model_id: str, ttl_s: int = TTL_S) -> None:
    """Keep a served model's text alive (called with its workers' heartbeats)."""
    client.expire(keys.model_text_key(model_id), ttl_s)


def digest(client: redis.Redis, model_id: str) -> str | None:
    value = client.hget(keys.model_text_key(model_id), "digest")
    return _text(value) if value else None


def fetch(client: redis.Redis, model_id: str) -> ModelText | None:
    raw = client.hgetall(keys.model_text_key(model_id))
    if not raw or "tokenizer" not in {_text(k) for k in raw}:
        return None
    return ModelText.from_redis({_text(k): _text(v) for k, v in raw.items()})


def _text(value: object) -> str:
    return value.decode("utf-8") if isinstance(value, bytes) else str(value)
