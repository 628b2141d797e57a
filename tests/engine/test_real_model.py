"""Bounded checks on the real default model (prepared once, loaded once per session)."""
from __future__ import annotations

import pytest

from engine.prepare_default import QWEN25_GENERATION_DEFAULTS
from engine.types import STOP, GenerationRequest, SamplingParams
from tests.tiny_model import QWEN25_CHAT_TEMPLATE

pytestmark = pytest.mark.slow


def test_default_model_is_prepared_with_qwen_defaults(real_engine):
    loaded = real_engine.loaded
    assert loaded.eos_ids == [151645, 151643]
    assert loaded.default_repetition_penalty == QWEN25_GENERATION_DEFAULTS["repetition_penalty"]
    assert not loaded.model.config.tie_word_embeddings
    # Our tiny models use exactly the real model's chat template.
    assert loaded.tokenizer.chat_template.strip() == QWEN25_CHAT_TEMPLATE.strip()
    assert loaded.load_s < 30


def test_official_streams_whole_chinese_characters(real_engine):
    pieces = []
    result = real_engine.generate(
        GenerationRequest(messages=[{"role": "user", "content": "用一句话介绍北京。"}],
                          sampling=SamplingParams(max_new_tokens=16)), on_text=pieces.append)
    assert "".join(pieces) == result.text and result.text.strip()
    assert all("\ufffd" not in p for p in pieces)
    assert any("\u4e00" <= ch <= "\u9fff" for ch in result.text)
    assert result.finish_reason in (STOP, "length") and result.usage.prompt_tokens > 20
