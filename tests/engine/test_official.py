"""The ``official`` method through the Engine on a tiny model: streaming, stops, usage, cancel."""
from __future__ import annotations

import pytest

from engine.engine import UnknownMethodError
from engine.prompt import PromptError, build_prompt
from engine.types import CANCELLED, LENGTH, STOP, GenerationRequest, SamplingParams

MESSAGES = [{"role": "user", "content": "你好 world, please compute 12 * 3"}]


def request(**sampling):
    return GenerationRequest(messages=MESSAGES, sampling=SamplingParams(**sampling))


def test_stream_adds_up_to_text_and_usage_is_counted(tiny_engine):
    pieces = []
    result = tiny_engine.generate(request(max_new_tokens=24), on_text=pieces.append)
    assert "".join(pieces) == result.text
    assert result.usage.prompt_tokens == tiny_engine.count_prompt_tokens(request())
    assert result.usage.completion_tokens == len(result.token_ids) + (result.finish_reason == STOP)
    assert result.finish_reason in (STOP, LENGTH)
    assert result.timings.ttft_s > 0 and result.timings.total_s >= result.timings.ttft_s
    assert result.method == "official"


def test_max_new_tokens_ends_with_length(tiny_engine):
    result = tiny_engine.generate(request(max_new_tokens=3))
    if result.finish_reason == LENGTH:
        assert len(result.token_ids) == 3
    else:  # the random model may end early with an end-of-sequence id
        assert result.finish_reason == STOP and len(result.token_ids) < 3


def test_greedy_is_deterministic_and_sampling_follows_the_seed(tiny_engine):
    greedy = [tiny_engine.generate(request(max_new_tokens=16)).token_ids for _ in range(2)]
    assert greedy[0] == greedy[1]
    a = tiny_engine.generate(request(max_new_tokens=16, temperature=1.0, seed=7)).token_ids
    b = tiny_engine.generate(request(max_new_tokens=16, temperature=1.0, seed=7)).token_ids
    assert a == b


def test_stop_string_cuts_text(tiny_engine):
    full = tiny_engine.generate(request(max_new_tokens=24))
    if len(full.text) < 4:
        pytest.skip("random model produced too little text")
    stop = full.text[2:4]
    cut = tiny_engine.generate(request(max_new_tokens=24, stop=(stop,)))
    assert cut.finish_reason == STOP
    assert cut.text == full.text[:full.text.find(stop)]


def test_cancel_between_tokens(tiny_engine):
    seen = []
    result = tiny_engine.generate(request(max_new_tokens=50), on_text=seen.append,
                                  should_cancel=lambda: len(seen) >= 2)
    if result.finish_reason != STOP:  # unless the model ended by itself first
        assert result.finish_reason == CANCELLED
        assert len(result.token_ids) < 50
    before = tiny_engine.generate(request(max_new_tokens=5), should_cancel=lambda: True)
    assert before.finish_reason == CANCELLED and before.token_ids == []


def test_prefix_is_the_system_message_and_tools_are_rendered(tiny_engine):
    tok = tiny_engine.loaded.tokenizer
    tools = [{"type": "function", "function": {"name": "calculator", "description": "math",
                                               "parameters": {"type": "object", "properties": {}}}}]
    req = GenerationRequest(messages=MESSAGES, prefix="You are terse.", tools=tools)
    prompt = build_prompt(tok, req)
    text = tok.decode(prompt.ids)
    assert text.startswith("<|im_start|>system\nYou are terse.\n\n# Tools")
    assert '"name": "calculator"' in text and text.endswith("<|im_start|>assistant\n")
    assert tok.decode(prompt.prefix_ids).endswith("</tool_call><|im_end|>\n")
    plain = build_prompt(tok, GenerationRequest(messages=MESSAGES))
    assert tok.decode(plain.prefix_ids).startswith("<|im_start|>system\nYou are Qwen")
    with pytest.raises(PromptError):
        build_prompt(tok, GenerationRequest(messages=[{"role": "system", "content": "a"}] + MESSAGES, prefix="b"))


def test_unknown_method_is_refused(tiny_engine):
    with pytest.raises(UnknownMethodError):
        tiny_engine.generate(GenerationRequest(messages=MESSAGES, method="nope"))


def test_info_and_stats(tiny_engine):
    info = tiny_engine.info()
    assert info["device"] == "cpu" and info["dtype"] == "float32" and "official" in info["methods"]
    assert tiny_engine.stats()["model_loaded"] is True
