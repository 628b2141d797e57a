"""The engine loop never stalls: a ``paged`` stream keeps its pace while every other method runs.

The loop resumes each non-batched request for one token per turn (:mod:`engine.solo`), so
between two tokens of a ``paged`` job each running job of ``official``, ``no_cache``,
``custom_cache`` and ``prefix_cache`` makes at most one token. On a loop that runs a solo
request to completion, the paged stream waits for all of that job's 128 tokens.

The test reads the order in which the loop thread accepts tokens (:mod:`tests.accepted_tokens`),
not clocks: that order is what the loop's turn decides, and it is the same on a quiet machine
and a busy one, where the time of a single turn also measures the neighbours (a process on
the sibling core slows it). ``python -m bench.fairness`` reports wall-clock gaps on the
default model.
"""
from __future__ import annotations

from collections import Counter

import pytest

from core.grammar import regex
from core.settings import load_settings
from engine.engine import Engine
from engine.types import GenerationRequest, SamplingParams
from tests.accepted_tokens import record_accepted

SOLO_METHODS = ("official", "no_cache", "custom_cache", "prefix_cache")
SOLO_TOKENS = 128
PAGED_TOKENS = 160    # outlives the solo jobs, which start one per turn after it
# lower-case words only: each token is a whole piece of text, so each streamed piece is a token
ASCII_WORDS = regex("[a-z ]+")


def _req(method: str, tokens: int, constraint=None, **sampling) -> GenerationRequest:
    return GenerationRequest(messages=[{"role": "user", "content": "hello world"}], method=method,
                             prefix="You are a helpful assistant.", constraint=constraint,
                             sampling=SamplingParams(max_new_tokens=tokens, **sampling))


@pytest.fixture
def engine(tiny_model_dir):
    eng = Engine(load_settings(model=str(tiny_model_dir), dtype="float32", device="cpu", quant="none"))
    for method in ("paged", *SOLO_METHODS):  # first-use costs (forward, pool, generate) out of the way
        eng.generate(_req(method, 2, ASCII_WORDS if method == "paged" else None))
    yield eng
    eng.close()


def _solo_tokens_between_paged_tokens(order: list[str]) -> list[Counter]:
    """For each gap between two paged tokens, how many tokens each other method made in it."""
    gaps: list[Counter] = []
    current: Counter | None = None
    for method in order:
        if method == "paged":
            if current is not None:
                gaps.append(current)
            current = Counter()
        elif current is not None:
            current[method] += 1
    return gaps


def test_a_paged_stream_keeps_its_pace_while_every_other_method_runs(engine, monkeypatch):
    tokens = record_accepted(monkeypatch)
    paged = engine.loop.submit(_req("paged", PAGED_TOKENS, ASCII_WORDS))
    solos = [engine.loop.submit(_req(method, SOLO_TOKENS, temperature=0.8, seed=7)) for method in SOLO_METHODS]
    pieces: list[str] = []
    result = paged.stream(pieces.append)
    for handle in solos:
        assert handle.result(timeout=30).usage.completion_tokens == SOLO_TOKENS

    assert result.finish_reason == "length" and len(pieces) == PAGED_TOKENS  # one piece per token
    accepted = [token.method for token in tokens]
    gaps = _solo_tokens_between_paged_tokens(accepted)
    assert len(gaps) == PAGED_TOKENS - 1
    worst = max(max(gap.values(), default=0) for gap in gaps)
    assert worst <= 1, f"a solo job made {worst} tokens between two paged tokens"
    assert accepted[-1] == "paged", "the solo jobs all ran while the paged job streamed"
    assert sum(sum(gap.values()) for gap in gaps) + accepted.index("paged") == len(SOLO_METHODS) * SOLO_TOKENS


def test_seeded_official_gives_the_same_tokens_interleaved_as_alone(engine):
    seeded = _req("official", 48, temperature=0.9, top_p=0.95, seed=123)
    alone = engine.generate(seeded).token_ids
    others = [engine.loop.submit(_req(m, 48, temperature=0.9, seed=5)) for m in ("official", "no_cache")]
    unseeded = engine.loop.submit(_req("official", 48, temperature=0.9))
    interleaved = engine.loop.submit(seeded)
    paged = engine.loop.submit(_req("paged", 48, temperature=0.9, seed=9))
    assert interleaved.result(timeout=60).token_ids == alone
    for handle in (*others, unseeded, paged):
        assert handle.result(timeout=60).usage.completion_tokens > 0
