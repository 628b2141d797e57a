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

import threading
from typing import Any

from core.grammar import Constraint
from engine.constrained.compiler import CompiledGrammar, GrammarCompiler, GrammarError
from engine.constrained.matcher import TokenConstraint

__all__ = ["CompiledGrammar", "GrammarCompiler", "GrammarError", "TokenConstraint", "compiler_for",
           "run_constraint", "token_constraint"]


_BUILD_LOCK = threading.Lock()


def compiler_for(engine: Any) -> GrammarCompiler:
    """The engine's grammar compiler, built on the first constrained request.

    Not engine-loop state: requests are compiled in the submitting thread (so a bad grammar
    raises to its caller and a compile never stalls the batch), and the compiler is
    thread-safe (its cache has a lock; llguidance releases the GIL while it compiles). The
    per-sequence :class:`TokenConstraint` it makes is then used by one thread only."""
    compiler = getattr(engine, "_grammar_compiler", None)
    if compiler is None:
        with _BUILD_LOCK:
            compiler = getattr(engine, "_grammar_compiler", None)
            if compiler is None:
                loaded = engine.loaded
                compiler = GrammarCompiler(loaded.tokenizer, int(loaded.model.config.vocab_size), loaded.eos_ids)
                engine._grammar_compiler = compiler
    return compiler


def run_constraint(engine: Any, run: Any, constraint: Constraint | None) -> TokenConstraint | None:
    """The request's constraint as the engine loop compiled it at submit (``run.constraint``),
    so a non-batched method does not compile the grammar a second time; compiled here only
    when a method is called without the loop (tests)."""
    made = getattr(run, "constraint", None)
    if made is not None or constraint is None:
        return made
    return token_constraint(engine, constraint)


def token_constraint(engine: Any, constraint: Constraint | None) -> TokenConstraint | None:
    """A fresh per-sequence constraint for a request, or None when it has none.
    Raises :class:`GrammarError` for a grammar that does not compile within the limits."""
    if constraint is None:
        return None
    compiler = compiler_for(engine)
    return TokenConstraint(compiler.compile(constraint), compiler.tokenizer)
