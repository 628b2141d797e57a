"""``min_p``, ``min_tokens`` and ``ignore_eos`` in every method, on the tiny model in fp32.

The end-of-sequence cases use an EOS-happy setup: a +100 bias on every end-of-sequence id
makes it the greedy (and, sampled, the near-certain) first token, so only the hold keeps the
answer going."""
from __future__ import annotations

import pytest
import torch
from transformers import MinPLogitsWarper

from core import grammar
from core.methods import GENERATION_METHODS
from engine.sampling import Sampler, min_p_mask
from engine.textstream import TextStream
from engine.types import LENGTH, STOP, GenerationRequest, SamplingParams

USER = [{"role": "user", "content": "Count with me: one two three"}]


def _req(method, **sampling):
    sampling.setdefault("max_new_tokens", 12)
    return GenerationRequest(messages=USER, method=method, sampling=SamplingParams(**sampling))


def _eos_bias(engine):
    return tuple((int(i), 100.0) for i in engine.loaded.eos_ids)


def test_min_p_keeps_exactly_the_tokens_at_or_above_min_p_times_the_top():
    probs = torch.tensor([0.40, 0.25, 0.15, 0.10, 0.06, 0.04])
    logits = torch.log(probs)
    kept = torch.isfinite(min_p_mask(logits, 0.3)).tolist()  # threshold 0.3 * 0.40 = 0.12
    assert kept == [True, True, True, False, False, False]
    assert torch.isfinite(min_p_mask(logits, 0.5)).tolist() == [True, True, False, False, False, False]
    assert torch.isfinite(min_p_mask(logits, 1.0)).sum() == 1  # only the top token
    assert torch.equal(min_p_mask(logits, 0.0), logits)  # 0 = off


def test_min_p_matches_transformers():
    for seed in range(5):
        logits = torch.randn(50, generator=torch.Generator().manual_seed(seed)) * 3
        for p in (0.05, 0.2, 0.7):
            assert torch.equal(min_p_mask(logits, p), MinPLogitsWarper(p)(None, logits[None].clone())[0])


def test_the_sampler_draws_only_tokens_min_p_keeps():
    logits = torch.log(torch.tensor([0.40, 0.25, 0.15, 0.10, 0.06, 0.04]))
    draws = {Sampler(SamplingParams(temperature=1.0, min_p=0.3, seed=s), 1.0, 6, [])(logits) for s in range(200)}
    assert draws == {0, 1, 2}
    wide = {Sampler(SamplingParams(temperature=1.0, seed=s), 1.0, 6, [])(logits) for s in range(200)}
    assert wide > {0, 1, 2}  # without min_p the tail is drawn too


def test_the_sampler_holds_eos_until_min_tokens():
    logits = torch.tensor([0.0, 0.0, 9.0, 1.0])  # id 2 is end-of-sequence and the greedy choice
    sampler = Sampler(SamplingParams(min_tokens=3), 1.0, 4, [], eos_ids=[2])
    assert [sampler(logits) for _ in range(4)] == [3, 3, 3, 2]
    always = Sampler(SamplingParams(ignore_eos=True), 1.0, 4, [], eos_ids=[2])
    assert [always(logits) for _ in range(10)] == [3] * 10


@pytest.mark.parametrize("method", GENERATION_METHODS)
def test_min_tokens_and_ignore_eos_with_an_eos_happy_model(tiny_engine, method):
    bias = _eos_bias(tiny_engine)
    eager = tiny_engine.generate(_req(method, logit_bias=bias))
    assert eager.token_ids == [] and eager.finish_reason == STOP  # EOS first: the setup is EOS-happy
    held = tiny_engine.generate(_req(method, logit_bias=bias, min_tokens=5))
    assert len(held.token_ids) == 5 and held.finish_reason == STOP  # EOS right after the fifth token
    ignored = tiny_engine.generate(_req(method, logit_bias=bias, ignore_eos=True))
    assert len(ignored.token_ids) == 12 and ignored.finish_reason == LENGTH
    assert not set(ignored.token_ids) & set(tiny_engine.loaded.eos_ids)


@pytest.mark.parametrize("method", GENERATION_METHODS)
def test_min_tokens_and_min_p_when_sampling(tiny_engine, method):
    bias = _eos_bias(tiny_engine)
    held = tiny_engine.generate(_req(method, logit_bias=bias, min_tokens=4, temperature=0.9, min_p=0.1, seed=3))
    assert len(held.token_ids) == 4 and held.finish_reason == STOP
    same = tiny_engine.generate(_req(method, temperature=0.9, min_p=0.1, seed=3))
    official = tiny_engine.generate(_req("official", temperature=0.9, min_p=0.1, seed=3))
    assert len(same.token_ids) >= 1 and len(official.token_ids) >= 1


@pytest.mark.parametrize("method", GENERATION_METHODS)
def test_a_stop_string_cannot_end_the_answer_before_min_tokens(tiny_engine, method):
    plain = tiny_engine.generate(_req(method, ignore_eos=True))
    stop = plain.text[:1]
    assert stop.strip(), plain.text  # the answer's first character is the stop string
    early = tiny_engine.generate(_req(method, ignore_eos=True, stop=(stop,)))
    assert early.finish_reason == STOP and early.text == ""
    at_least = len(early.token_ids) + 4
    held = tiny_engine.generate(_req(method, ignore_eos=True, stop=(stop,), min_tokens=at_least))
    assert len(held.token_ids) >= at_least and held.token_ids == plain.token_ids[:len(held.token_ids)]
    assert held.text.startswith(stop)


def test_the_text_stream_searches_stop_strings_from_min_tokens_on(tiny_engine):
    tokenizer = tiny_engine.loaded.tokenizer
    ids = tokenizer.encode("ab ab ab ab", add_special_tokens=False)
    free = TextStream(tokenizer, ("ab",))
    assert [free.push(i)[1] for i in ids].index(True) < len(ids) - 1
    held = TextStream(tokenizer, ("ab",), min_tokens=len(ids))
    hits = [held.push(i)[1] for i in ids]
    assert not any(hits[:-1]) and hits[-1] and held.text == "ab ab ab "


@pytest.mark.parametrize("method", ["official", "custom_cache", "paged"])
def test_a_finished_grammar_still_ends_the_answer_under_min_tokens(tiny_engine, method):
    """When the grammar allows nothing but end-of-sequence, the hold gives way: the answer
    is still exactly one of the choices, not max_new_tokens of masked garbage."""
    request = GenerationRequest(messages=USER, method=method, constraint=grammar.choice(["yes", "no"]),
                                sampling=SamplingParams(max_new_tokens=30, min_tokens=20, ignore_eos=True))
    result = tiny_engine.generate(request)
    assert result.text in ("yes", "no") and result.finish_reason == STOP
