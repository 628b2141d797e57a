"""Constrained decoding: a grammar's token mask applied in our sampler (llguidance inside).

* :mod:`engine.constrained.compiler` - grammar text to a matcher template, cached by hash,
  bounded by llguidance's parser limits;
* :mod:`engine.constrained.matcher` - one sequence's state: mask before a sample, accept
  after it; lazy (trigger-started) grammars for ``tool_choice: auto``;
* :mod:`engine.constrained.bitmask` - packed bitmask to ``-inf`` logits;
* :mod:`engine.constrained.processor` - the same for transformers' ``generate`` (``official``).

:func:`token_constraint` is the one entry point the methods use.
"""
from __future__ import annotations

from typing import Any

from core.grammar import Constraint
from engine.constrained.compiler import CompiledGrammar, GrammarCompiler, GrammarError
from engine.constrained.matcher import TokenConstraint

__all__ = ["CompiledGrammar", "GrammarCompiler", "GrammarError", "TokenConstraint", "compiler_for",
           "token_constraint"]


def compiler_for(engine: Any) -> GrammarCompiler:
    """The engine's grammar compiler (built on first constrained request)."""
    loaded = engine.loaded
    vocab = int(loaded.model.config.vocab_size)
    return engine.state("grammar_compiler", lambda: GrammarCompiler(loaded.tokenizer, vocab, loaded.eos_ids))


def token_constraint(engine: Any, constraint: Constraint | None) -> TokenConstraint | None:
    """A fresh per-sequence constraint for a request, or None when it has none.
    Raises :class:`GrammarError` for a grammar that does not compile within the limits."""
    if constraint is None:
        return None
    compiler = compiler_for(engine)
    return TokenConstraint(compiler.compile(constraint), compiler.tokenizer)
