"""Each model's tokenizer, chat template and context length in the web, loaded lazily per model.

Where a model's text side comes from: for the web's own model (``MINISERVE_MODEL``), its
prepared local folder when it has one (``tokenizer.json``, chat template, ``config.json``:
the files that model's workers load); for any other model, or the web's own without a
folder here, what its workers published under its id (core/model_text.py: the tokenizer the
worker itself encodes with). No torch: the ``tokenizers`` library and jinja2 only. Loading
the default model's tokenizer takes about 0.8 s, which under gevent holds the process's
other requests: the boot loads the own model and every model published so far
(:meth:`ModelTexts.warm_up`); a model that appears later loads on its first request.

Each model is loaded once and cached; the published digest is looked at again at most every
``recheck_s`` (``unknown_recheck_s`` while nothing is known of the model, so a starting
worker's tokenizer is picked up within seconds), so workers restarted with another
tokenizer are followed. A Redis error keeps what is cached.
"""
from __future__ import annotations

import functools
import json
import logging
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import redis

from core import model_text as published
from core.logs import log_event
from web.chat_template import compile_template, load_chat_template
from web.tokenizer import load_tokenizer

logger = logging.getLogger("miniserve.web.model_texts")
FALLBACK_CONTEXT = 32_768
RECHECK_S = 30.0
UNKNOWN_RECHECK_S = 2.0


@dataclass(frozen=True)
class TextModel:
    """One model's text side, ready to use (the Tokenizer is safe to share between threads)."""

    tokenizer: Any  # tokenizers.Tokenizer
    template: Any | None  # a compiled jinja template, or None
    context_length: int
    special_tokens: dict[str, str] = field(default_factory=dict)
    source: str = "folder"  # "published" (by a worker) or "folder" (the web's own files)
    digest: str | None = None

    @property
    def vocab_size(self) -> int:
        return int(self.tokenizer.get_vocab_size(with_added_tokens=True))


@dataclass
class _Entry:
    model: TextModel | None
    checked_at: float


@dataclass
class ModelTexts:
    client: Any  # redis.Redis (or a test double)
    own_model: str  # the web's MINISERVE_MODEL id
    own_folder: Path | None  # its prepared folder here, if any
    recheck_s: float = RECHECK_S
    unknown_recheck_s: float = UNKNOWN_RECHECK_S
    clock: Callable[[], float] = time.monotonic
    _entries: dict[str, _Entry] = field(default_factory=dict, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def get(self, model: str | None = None) -> TextModel | None:
        """The text side of ``model`` (None: the web's own), or None when nothing is known."""
        model = model or self.own_model
        if model == self.own_model and (local := self.own_folder_model()) is not None:
            return local
        now = self.clock()
        with self._lock:
            entry = self._entries.get(model)
            if entry is not None and now - entry.checked_at < self._wait(entry):
                return entry.model
            found = self._look(model, entry.model if entry else None)
            self._entries[model] = _Entry(found, now)
            return found

    def warm_up(self, models: list[str]) -> None:
        """Load the web's own model and ``models`` (those seen in the cluster) now."""
        for model in [self.own_model, *models]:
            self.get(model)

    def own_folder_model(self) -> TextModel | None:
        """The web's own model from its local folder (the warm-up loads it at boot)."""
        return _from_folder(self.own_folder)

    def _wait(self, entry: _Entry) -> float:
        return self.recheck_s if entry.model is not None else self.unknown_recheck_s

    def _look(self, model: str, cached: TextModel | None) -> TextModel | None:
        try:
            current = published.digest(self.client, model)
            if current is not None and cached is not None and cached.digest == current:
                return cached
            text = published.fetch(self.client, model) if current is not None else None
        except redis.RedisError as exc:
            log_event(logger, "model_text_unreadable", level=logging.WARNING, model=model, error=type(exc).__name__)
            return cached
        if text is not None:
            loaded = _from_published(text)
            log_event(logger, "model_text_loaded", model=model, source="published", vocab=loaded.vocab_size)
            return loaded
        return None


def _from_published(text: published.ModelText) -> TextModel:
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_str(text.tokenizer_json)
    tokenizer.no_truncation()  # the worker's backend may carry a call's settings: never cut a count
    tokenizer.no_padding()
    template = compile_template(text.chat_template) if text.chat_template else None
    return TextModel(tokenizer, template, text.context_length, dict(text.special_tokens), "published", text.digest)


@functools.lru_cache(maxsize=4)
def _from_folder(folder: Path | None) -> TextModel | None:
    tokenizer = load_tokenizer(folder)
    if tokenizer is None or folder is None:
        return None
    return TextModel(tokenizer, load_chat_template(folder), _context_length(folder / "config.json"),
                     _special_tokens(folder / "tokenizer_config.json"), "folder", None)


def _context_length(config_file: Path) -> int:
    try:
        config = json.loads(config_file.read_text(encoding="utf-8"))
        return int(config.get("max_position_embeddings") or FALLBACK_CONTEXT)
    except (OSError, ValueError, TypeError):
        return FALLBACK_CONTEXT


def _special_tokens(config_file: Path) -> dict[str, str]:
    """``bos_token``, ``eos_token``... as ``tokenizer_config.json`` writes them (text or {content})."""
    try:
        config = json.loads(config_file.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    out = {}
    for name in ("bos_token", "eos_token", "unk_token", "pad_token"):
        value = config.get(name)
        value = value.get("content") if isinstance(value, dict) else value
        if isinstance(value, str):
            out[name] = value
    return out
