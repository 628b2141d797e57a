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
from engine.run import GenerationRun
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


def test_a_long_solo_prompt_is_prefilled_a_budget_at_a_time_between_the_paged_tokens(tiny_model_dir, monkeypatch):
    """custom_cache and prefix_cache prefill a long prompt in chunks of the step budget and
    hand the loop back between them: between two tokens of a running paged sequence, the
    loop spends at most MINISERVE_MAX_BATCHED_TOKENS prompt tokens on them."""
    from engine.forward import Qwen2Forward

    budget = 16
    eng = Engine(load_settings(model=str(tiny_model_dir), dtype="float32", device="cpu", quant="none",
                               max_batched_tokens=budget))
    try:
        for method in ("paged", "custom_cache", "prefix_cache"):
            eng.generate(_req(method, 2, ASCII_WORDS if method == "paged" else None))
        order: list[tuple[str, int]] = []
        accept, call = GenerationRun.accept, Qwen2Forward.__call__
        monkeypatch.setattr(GenerationRun, "accept", lambda run, token: order.append((run.method, 1)) or accept(run, token))
        monkeypatch.setattr(Qwen2Forward, "__call__", lambda fwd, ids, cache, *a, **k:
                            order.append(("solo_forward", int(ids.numel()))) or call(fwd, ids, cache, *a, **k))
        long_prompt = GenerationRequest(messages=[{"role": "user", "content": "word " * 150}], method="custom_cache",
                                        sampling=SamplingParams(max_new_tokens=3))
        paged = eng.loop.submit(_req("paged", 120, ASCII_WORDS))
        solo = [eng.loop.submit(long_prompt), eng.loop.submit(GenerationRequest(
            messages=[{"role": "user", "content": "word " * 150}], prefix="system " * 40, method="prefix_cache",
            sampling=SamplingParams(max_new_tokens=3)))]
        assert paged.result(timeout=60).usage.completion_tokens == 120
        for handle in solo:
            assert handle.result(timeout=60).usage.prompt_tokens > 150
    finally:
        eng.close()
    paged_at = [i for i, (what, _) in enumerate(order) if what == "paged"]
    prompt_chunks = [n for what, n in order if what == "solo_forward" and n > 1]
    assert len(prompt_chunks) >= 2 * 10 and max(prompt_chunks) <= budget     # both prompts went in chunks
    for start, end in zip(paged_at, paged_at[1:]):
        spent = sum(n for what, n in order[start:end] if what == "solo_forward")
        assert spent <= budget + 2, f"{spent} solo tokens between two paged tokens"  # the budget + 2 decode tokens
