"""Grammar text to a ready llguidance matcher, once per grammar: cached by the grammar's hash.

One :class:`GrammarCompiler` per engine wraps the model's tokenizer for llguidance (about a
second, once) and keeps an LRU of compiled templates; each sequence gets a ``deep_copy`` of
its template (microseconds), so a tool set or schema used again is not compiled again.

Bounds: llguidance measures work in "fuel" and sizes, not seconds. ``PARSER_LIMITS`` caps the
lexer's regex building, each mask step, the grammar size and the lexer states (memory), so a
hostile grammar stops with an error instead of hanging the engine loop; the web checks the
same grammar with the same limits before a job is queued (see docs/constrained.md).
"""
from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Iterable

import llguidance

from core.grammar import PARSER_LIMITS, Constraint
from core.logs import log_event

logger = logging.getLogger("miniserve.engine.constrained")
CACHE_ENTRIES = 128


def parser_limits() -> llguidance.LLParserLimits:
    return llguidance.LLParserLimits(**PARSER_LIMITS)


class GrammarError(ValueError):
    """The grammar cannot be compiled or has run out of its limits (the request's fault)."""


@dataclass
class CompiledGrammar:
    constraint: Constraint
    template: llguidance.LLMatcher
    compile_s: float

    def new_matcher(self) -> llguidance.LLMatcher:
        return self.template.deep_copy()


class GrammarCompiler:
    def __init__(self, tokenizer: Any, vocab_size: int, eos_ids: Iterable[int],
                 max_entries: int = CACHE_ENTRIES) -> None:
        import llguidance.hf

        started = time.perf_counter()
        self.tokenizer = llguidance.hf.from_tokenizer(tokenizer, n_vocab=vocab_size, eos_token=list(eos_ids))
        self.vocab_size = vocab_size
        self.max_entries = max_entries
        self._cache: OrderedDict[str, CompiledGrammar] = OrderedDict()
        self._lock = threading.Lock()
        self.hits = self.misses = 0
        log_event(logger, "grammar_tokenizer_ready", vocab=vocab_size,
                  setup_ms=round((time.perf_counter() - started) * 1000, 1))

    def compile(self, constraint: Constraint) -> CompiledGrammar:
        key = constraint.key
        with self._lock:
            found = self._cache.get(key)
            if found is not None:
                self._cache.move_to_end(key)
                self.hits += 1
                return found
        compiled = self._build(constraint)
        with self._lock:
            self.misses += 1
            self._cache[key] = compiled
            while len(self._cache) > self.max_entries:
                self._cache.popitem(last=False)
        return compiled

    def _build(self, constraint: Constraint) -> CompiledGrammar:
        started = time.perf_counter()
        matcher = llguidance.LLMatcher(self.tokenizer, constraint.grammar, log_level=0, limits=parser_limits())
        if not matcher.is_error():
            matcher.compute_bitmask()  # the first mask builds the lexer: part of compiling
        if matcher.is_error():
            raise GrammarError(f"{constraint.kind} grammar: {matcher.get_error()}")
        elapsed = time.perf_counter() - started
        log_event(logger, "grammar_compiled", kind=constraint.kind, key=constraint.key,
                  compile_ms=round(elapsed * 1000, 2), grammar_chars=len(constraint.grammar))
        return CompiledGrammar(constraint, matcher, elapsed)

    def stats(self) -> dict[str, Any]:
        with self._lock:
            return {"entries": len(self._cache), "hits": self.hits, "misses": self.misses}
