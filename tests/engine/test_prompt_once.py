"""``build_prompt`` renders a request once and encodes it once, and finds the same system
block as rendering a probe and encoding the block on its own (the reference)."""
from __future__ import annotations

import pytest

from engine.prompt import Prompt, _render, _slow_prompt, build_prompt, chat_messages
from engine.types import GenerationRequest, SamplingParams

TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
                                           "parameters": {"type": "object",
                                                          "properties": {"city": {"type": "string"}}}}}]
SHAPES = [
    {"messages": [{"role": "user", "content": "hi"}]},
    {"messages": [{"role": "user", "content": "hi  \n\n there"}], "prefix": "You are terse.  "},
    {"messages": [{"role": "system", "content": "S <|im_start|>user inside"}, {"role": "user", "content": "q"}]},
    {"messages": [{"role": "system", "content": "S"}, {"role": "assistant", "content": "a"},
                  {"role": "user", "content": "q"}]},
    {"messages": [{"role": "assistant", "content": "a"}, {"role": "user", "content": "q"}]},
    {"messages": [{"role": "user", "content": "中文 测试 🙂"}], "prefix": "Système : réponds. " * 20},
    {"messages": [{"role": "user", "content": "weather?"}], "tools": TOOLS},
    {"messages": [{"role": "user", "content": "weather?"}], "prefix": "with tools", "tools": TOOLS},
    {"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"},
                  {"role": "user", "content": "z"}], "prefix": " trailing space "},
]


class Counting:
    """The tokenizer, counting renders and encodings."""

    def __init__(self, tokenizer) -> None:
        self.inner, self.renders, self.encodes = tokenizer, 0, 0
        self.is_fast = tokenizer.is_fast

    def apply_chat_template(self, *args, **kwargs):
        self.renders += 1
        return self.inner.apply_chat_template(*args, **kwargs)

    def __call__(self, *args, **kwargs):
        self.encodes += 1
        return self.inner(*args, **kwargs)

    def encode(self, *args, **kwargs):
        self.encodes += 1
        return self.inner.encode(*args, **kwargs)


def reference(tokenizer, request: GenerationRequest) -> Prompt:
    """The block found by rendering a probe, encoded on its own and checked as a prefix."""
    messages = chat_messages(request)
    full_text = _render(tokenizer, messages, request.tools, generation_prompt=True)
    system = [m for m in messages[:1] if m.get("role") == "system"]
    probe = _render(tokenizer, system + [{"role": "user", "content": "x"}], request.tools, generation_prompt=False)
    cut = probe.find("<|im_start|>user")
    prefix_text = probe[:cut] if cut > 0 and full_text.startswith(probe[:cut]) else ""
    return _slow_prompt(tokenizer, full_text, prefix_text)


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    from transformers import AutoTokenizer

    loaded = AutoTokenizer.from_pretrained(tiny_model_dir)
    assert loaded.is_fast
    return loaded


@pytest.mark.parametrize("shape", SHAPES, ids=range(len(SHAPES)))
def test_same_ids_and_system_block_as_the_reference(tokenizer, shape):
    request = GenerationRequest(sampling=SamplingParams(), method="paged", **shape)
    assert build_prompt(tokenizer, request) == reference(tokenizer, request)


def test_one_render_and_one_encoding_when_the_user_speaks_first(tokenizer):
    counting = Counting(tokenizer)
    prompt = build_prompt(counting, GenerationRequest(messages=[{"role": "user", "content": "q"}],
                                                      prefix="A system part long enough to cache.",
                                                      sampling=SamplingParams(), method="paged"))
    assert (counting.renders, counting.encodes) == (1, 1)
    assert 0 < prompt.prefix_len < len(prompt.ids)


def test_a_probe_only_when_another_role_follows_the_system_part(tokenizer):
    counting = Counting(tokenizer)
    build_prompt(counting, GenerationRequest(**SHAPES[3], sampling=SamplingParams(), method="paged"))
    assert (counting.renders, counting.encodes) == (2, 1)
