"""The ``paged`` generation method: greedy tokens equal ``official``; prefix hits are reported."""
from __future__ import annotations

import pytest

from engine.types import GenerationRequest, SamplingParams

QUESTIONS = ["Hello, world!", "Please compute 12 * (3 + 4) and explain the steps.",
             "你好，世界！今天天气很好。", "Write a short poem about the sea, the wind and the stars at night."]


def request(text: str, method: str, prefix: str | None = None, **sampling) -> GenerationRequest:
    params = SamplingParams(**{"max_new_tokens": 24, **sampling})
    return GenerationRequest(messages=[{"role": "user", "content": text}], sampling=params,
                             method=method, prefix=prefix)


@pytest.mark.parametrize("text", QUESTIONS)
def test_paged_greedy_equals_official(paged_engine, text):
    official = paged_engine.generate(request(text, "official"))
    paged = paged_engine.generate(request(text, "paged"))
    assert paged.token_ids == official.token_ids
    assert paged.text == official.text
    assert paged.finish_reason == official.finish_reason
    assert paged.method == "paged"
    assert paged.usage.prompt_tokens == official.usage.prompt_tokens


def test_shared_prefix_hit_keeps_greedy_output(paged_engine):
    prefix = "You are a helpful assistant. The quick brown fox jumps over the lazy dog. " * 3
    first = paged_engine.generate(request("Hello, world!", "paged", prefix=prefix))
    second_req = request("How are you today?", "paged", prefix=prefix)
    second = paged_engine.generate(second_req)
    official = paged_engine.generate(request("How are you today?", "official", prefix=prefix))
    assert second.usage.cached_tokens >= 40          # the system block, whole 4-token blocks
    assert second.usage.cached_tokens % 4 == 0
    assert second.token_ids == official.token_ids
    assert first.usage.cached_tokens < second.usage.cached_tokens


def test_stop_string_and_max_tokens(paged_engine):
    full = paged_engine.generate(request(QUESTIONS[1], "paged"))
    assert len(full.text) > 4
    stop = full.text[2:4]
    cut = paged_engine.generate(request(QUESTIONS[1], "paged", stop=(stop,)))
    assert cut.finish_reason == "stop" and stop not in cut.text
    assert full.text.startswith(cut.text)
    short = paged_engine.generate(request(QUESTIONS[1], "paged", max_new_tokens=3))
    assert short.usage.completion_tokens <= 3


def test_cancel_midway_frees_blocks(paged_engine):
    pieces = []
    result = paged_engine.generate(request(QUESTIONS[0], "paged"), on_text=pieces.append,
                                   should_cancel=lambda: len(pieces) >= 2)
    assert result.finish_reason == "cancelled"
    stats = paged_engine.loop.call(lambda: paged_engine.loop.paged.blocks.stats())
    assert stats.blocks_used == 0 and stats.sequences == 0


def test_seeded_sampling_is_reproducible(paged_engine):
    kwargs = dict(temperature=0.8, top_p=0.9, top_k=20, seed=7)
    a = paged_engine.generate(request(QUESTIONS[2], "paged", **kwargs))
    b = paged_engine.generate(request(QUESTIONS[2], "paged", **kwargs))
    assert a.token_ids == b.token_ids


def test_paged_equals_custom_cache(paged_engine):
    for text in QUESTIONS[:2]:
        custom = paged_engine.generate(request(text, "custom_cache"))
        paged = paged_engine.generate(request(text, "paged"))
        assert paged.token_ids == custom.token_ids
