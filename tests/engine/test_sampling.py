"""Sampling pieces against transformers' own logits processors, and seeds."""
from __future__ import annotations

import torch
from transformers.generation.logits_process import (RepetitionPenaltyLogitsProcessor, TopKLogitsWarper,
                                                    TopPLogitsWarper)

from engine.sampling import (Sampler, apply_repetition_penalty, argmax, float_copy, penalize_seen, top_k_mask,
                             top_p_mask)
from engine.types import SamplingParams

VOCAB = 50


def _logits(seed=0):
    return torch.randn(VOCAB, generator=torch.Generator().manual_seed(seed)) * 3


def test_repetition_penalty_matches_transformers():
    logits = _logits()
    ids = torch.tensor([[3, 7, 7, 12, 49, 0]])
    expected = RepetitionPenaltyLogitsProcessor(1.3)(ids, logits[None].clone())[0]
    seen = torch.zeros(VOCAB, dtype=torch.bool)
    seen[ids[0]] = True
    assert torch.equal(apply_repetition_penalty(logits, seen, 1.3), expected)


def test_top_k_and_top_p_masks_match_transformers():
    for seed in range(5):
        logits = _logits(seed)
        for k in (1, 5, 20):
            assert torch.equal(top_k_mask(logits, k), TopKLogitsWarper(k)(None, logits[None].clone())[0])
            assert int(torch.isfinite(top_k_mask(logits, k)).sum()) == k
        for p in (0.1, 0.5, 0.9):
            assert torch.equal(top_p_mask(logits, p), TopPLogitsWarper(p)(None, logits[None].clone())[0])
    masked = top_p_mask(torch.tensor([5.0, 0.0, -5.0]), 0.5)
    assert torch.isfinite(masked).tolist() == [True, False, False]  # the top token alone covers 0.5
    assert torch.equal(top_k_mask(_logits(), 0), _logits()) and torch.equal(top_p_mask(_logits(), 1.0), _logits())


def test_greedy_sampler_is_argmax_after_penalty_and_remembers_tokens():
    logits = torch.zeros(VOCAB)
    logits[4], logits[9] = 2.0, 1.9
    sampler = Sampler(SamplingParams(), 1.1, VOCAB, prompt_ids=[4])
    assert sampler(logits) == 9  # 2.0 / 1.1 < 1.9
    assert bool(sampler.seen[9]) and bool(sampler.seen[4])
    assert sampler(logits) == 4  # both seen now: 2.0/1.1 > 1.9/1.1


def test_seed_reproduces_samples_and_temperature_spreads_them():
    params = SamplingParams(temperature=1.0, seed=42)
    draw = lambda p: [Sampler(p, 1.0, VOCAB, [])(_logits(i)) for i in range(20)]  # noqa: E731
    assert draw(params) == draw(params)
    assert draw(params) != draw(SamplingParams(temperature=1.0, seed=43))
    greedy = [int(torch.argmax(_logits(i))) for i in range(20)]
    assert draw(SamplingParams(temperature=0.01, seed=1)) == greedy
    assert draw(SamplingParams(temperature=1.0, top_k=1, seed=1)) == greedy


EXTREMES = [dict(temperature=1e-300), dict(temperature=1.0, repetition_penalty=1e-308),
            dict(temperature=1e-300, repetition_penalty=1e-308, top_p=0.5, top_k=3),
            dict(temperature=2.0, repetition_penalty=10.0)]


def test_sampler_survives_extreme_values():
    """Tiny temperatures or penalties overflow float32 scores; the sampler still picks a token."""
    for case in EXTREMES:
        penalty = case.pop("repetition_penalty", 1.0)
        params = SamplingParams(seed=3, **case)
        sampler = Sampler(params, penalty, VOCAB, prompt_ids=[1, 2, 3, 4])
        for seed in range(3):
            token = sampler(_logits(seed) * 1e3)
            assert 0 <= token < VOCAB
    inf_logits = _logits().clone()
    inf_logits[5] = float("inf")
    assert Sampler(SamplingParams(temperature=1.0, seed=1), 1.0, VOCAB, [])(inf_logits) == 5


def test_every_method_returns_tokens_at_sampling_extremes(tiny_engine):
    from engine.types import GenerationRequest

    for method in ("official", "custom_cache", "paged"):
        for case in ([dict(temperature=1e-300), dict(temperature=1.0, repetition_penalty=1e-308)]):
            request = GenerationRequest(messages=[{"role": "user", "content": "hi"}], method=method,
                                        sampling=SamplingParams(max_new_tokens=4, seed=1, **case))
            result = tiny_engine.generate(request)
            assert result.usage.completion_tokens >= 1, (method, case)


def test_penalize_seen_gathers_the_same_values_as_the_full_vocabulary_pass():
    gen = torch.Generator().manual_seed(7)
    for penalty in (1.1, 1.3, 0.7, 1e-4):
        logits = torch.randn(151_936, generator=gen) * 10
        seen = torch.rand(151_936, generator=gen) < 0.01
        want = apply_repetition_penalty(logits, seen, penalty)
        got = penalize_seen(float_copy(logits), seen, penalty)
        assert torch.equal(got, want)
        assert argmax(got) == int(torch.argmax(want))
    assert not torch.equal(want, logits)  # the penalty changed something
    ties = torch.tensor([0.0, 3.0, 1.0, 3.0])
    assert argmax(ties) == int(torch.argmax(ties)) == 1  # the first maximal index, as torch
    bf16 = logits.to(torch.bfloat16)
    assert float_copy(bf16).dtype == torch.float32 and float_copy(logits).data_ptr() != logits.data_ptr()
