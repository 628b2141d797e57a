"""``paged`` on the real default model: greedy tokens equal ``official``, with a prefix hit."""
import pytest

from engine.types import GenerationRequest, SamplingParams

SYSTEM = ("You are a careful assistant for a small inference service. Answer in one short "
          "paragraph and never invent facts. ") * 3


def req(text, method, prefix=None):
    return GenerationRequest(messages=[{"role": "user", "content": text}], method=method,
                             prefix=prefix, sampling=SamplingParams(max_new_tokens=16))


@pytest.mark.slow
def test_paged_equals_official_on_the_real_model(real_engine):
    first = real_engine.generate(req("What is a KV cache?", "paged", SYSTEM))
    official = real_engine.generate(req("What is a KV cache?", "official", SYSTEM))
    assert first.token_ids == official.token_ids and len(first.token_ids) >= 8
    hit = real_engine.generate(req("Why is the sky blue?", "paged", SYSTEM))
    official = real_engine.generate(req("Why is the sky blue?", "official", SYSTEM))
    assert hit.usage.cached_tokens >= 48                 # the shared system block
    assert hit.token_ids == official.token_ids
