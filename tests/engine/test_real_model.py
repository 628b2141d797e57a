"""Bounded checks on the real default model (prepared once, loaded once per session)."""
from __future__ import annotations

import pytest

from engine.handwritten import prefix_store
from engine.prepare_default import QWEN25_GENERATION_DEFAULTS
from engine.types import STOP, GenerationRequest, SamplingParams
from tests.agreement import common_prefix
from tests.tiny_model import QWEN25_CHAT_TEMPLATE

pytestmark = pytest.mark.slow


def test_default_model_is_prepared_with_qwen_defaults(real_engine):
    loaded = real_engine.loaded
    assert loaded.eos_ids == [151645, 151643]
    assert loaded.default_repetition_penalty == QWEN25_GENERATION_DEFAULTS["repetition_penalty"]
    assert not loaded.model.config.tie_word_embeddings
    # Our tiny models use exactly the real model's chat template.
    assert loaded.tokenizer.chat_template.strip() == QWEN25_CHAT_TEMPLATE.strip()


def test_official_streams_whole_chinese_characters(real_engine):
    pieces = []
    result = real_engine.generate(
        GenerationRequest(messages=[{"role": "user", "content": "用一句话介绍北京。"}],
                          sampling=SamplingParams(max_new_tokens=16)), on_text=pieces.append)
    assert "".join(pieces) == result.text and result.text.strip()
    assert all("\ufffd" not in p for p in pieces)
    assert any("\u4e00" <= ch <= "\u9fff" for ch in result.text)
    assert result.finish_reason in (STOP, "length") and result.usage.prompt_tokens > 20


PROMPTS = {"zh": "用一句话介绍北京。", "en": "Write a haiku about the sea."}


def _greedy(engine, method, text, prefix=None, tokens=16):
    request = GenerationRequest(messages=[{"role": "user", "content": text}], prefix=prefix, method=method,
                                sampling=SamplingParams(max_new_tokens=tokens))
    return engine.generate(request)


# bf16 rounds by kernel and by call shape, so a cached step and official's transformers pass
# may flip a near-tie: on a Xeon without AVX512-BF16 custom_cache left official at token 13 of
# 16. A cache that reads the wrong positions or stale K/V leaves it within the first tokens.
BF16_MIN_COMMON_PREFIX = 6


@pytest.mark.parametrize("lang", list(PROMPTS))
def test_bf16_cached_decoding_agrees_with_official(real_engine, lang, record_property):
    """custom_cache and a prefix_cache miss in bf16: agreement with official against a floor
    (the exact identity of every method is checked in float32 below)."""
    official = _greedy(real_engine, "official", PROMPTS[lang], prefix="You are concise.")
    assert len(official.token_ids) >= 8
    for method in ("custom_cache", "prefix_cache"):
        real_engine.loop.call(lambda: prefix_store(real_engine).clear())  # a miss, whatever ran before
        tokens = _greedy(real_engine, method, PROMPTS[lang], prefix="You are concise.").token_ids
        shared = common_prefix(tokens, official.token_ids)
        record_property(f"{method}_common_prefix", f"{shared}/{len(official.token_ids)}")
        assert shared >= min(BF16_MIN_COMMON_PREFIX, len(official.token_ids)), (method, shared, tokens)


SYSTEM = ("You are a careful assistant for a small inference service. Answer in one short "
          "paragraph and never invent facts. ") * 3


@pytest.mark.parametrize("lang", list(PROMPTS))
def test_all_methods_equal_official_fp32(real_engine_fp32, lang):
    official = _greedy(real_engine_fp32, "official", PROMPTS[lang])
    assert len(official.token_ids) >= 8
    # prefix_cache: a miss, then a hit; paged through the engine loop's scheduler
    for method in ("no_cache", "custom_cache", "prefix_cache", "prefix_cache", "paged"):
        result = _greedy(real_engine_fp32, method, PROMPTS[lang])
        assert result.token_ids == official.token_ids, method
        assert result.text == official.text
        if method == "prefix_cache":
            cached = result.usage.cached_tokens
    assert cached > 0


def test_paged_shares_a_system_prefix_and_still_equals_official_fp32(real_engine_fp32):
    """A second request with the same system prompt reuses its blocks (a paged prefix hit)."""
    first = _greedy(real_engine_fp32, "paged", "What is a KV cache?", prefix=SYSTEM)
    hit = _greedy(real_engine_fp32, "paged", "Why is the sky blue?", prefix=SYSTEM)
    assert hit.usage.cached_tokens >= 48                 # the shared system block
    for text, result in (("What is a KV cache?", first), ("Why is the sky blue?", hit)):
        assert result.token_ids == _greedy(real_engine_fp32, "official", text, prefix=SYSTEM).token_ids


def test_tokenizer_without_its_init_tables_works_as_loaded(real_engine):
    """load_model drops the Python vocab/merges copies (~60 MB) the tokenizer no longer reads:
    encoding, decoding, the chat template and the vocabulary match a freshly loaded one."""
    from transformers import AutoTokenizer

    ours = real_engine.loaded.tokenizer
    fresh = AutoTokenizer.from_pretrained(real_engine.loaded.path)
    assert len(fresh._vocab) > 150_000 and not ours._vocab and not ours._merges
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "用一句话介绍北京, and rename foo_bar()."}]
    rendered = ours.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert rendered == fresh.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    ids = ours.encode(rendered, add_special_tokens=False)
    assert ids == fresh.encode(rendered, add_special_tokens=False)
    assert ours.decode(ids) == fresh.decode(ids) == rendered
    assert ours.get_vocab() == fresh.get_vocab() and ours.eos_token_id == fresh.eos_token_id
