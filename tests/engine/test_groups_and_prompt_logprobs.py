"""Raw completion prompts, groups of requests (n choices sharing a prompt's KV blocks),
log-probabilities streamed with their text, and a prompt's own log-probabilities, on the
tiny model in fp32."""
from __future__ import annotations

import pytest
import torch

from core.settings import load_settings
from engine.engine import Engine
from engine.types import GenerationRequest, SamplingParams

PROMPT = "The quick brown fox jumps over the lazy dog. Hello, world! How are you today? " * 2
METHODS = ["official", "no_cache", "custom_cache", "prefix_cache", "paged"]


def _req(method="paged", prompt=PROMPT, **sampling):
    sampling.setdefault("max_new_tokens", 8)
    return GenerationRequest(messages=[], raw_prompt=prompt, method=method, sampling=SamplingParams(**sampling))


@pytest.fixture
def engine(tiny_model_dir):
    eng = Engine(load_settings(model=str(tiny_model_dir), dtype="float32", device="cpu", quant="none",
                               kv_block_size=4, kv_num_blocks=256, max_batch=8, max_batched_tokens=256))
    yield eng
    eng.close()


def test_a_raw_prompt_is_the_text_as_is(engine):
    tokenizer = engine.loaded.tokenizer
    assert engine.prompt(_req()).ids == tokenizer.encode(PROMPT)
    assert "<|im_start|>" not in tokenizer.decode(engine.prompt(_req()).ids)


@pytest.mark.parametrize("method", METHODS)
def test_a_group_gives_each_member_its_own_answer(engine, method):
    """Greedy members of one prompt agree with a lone request; seeded ones follow their seed."""
    alone = engine.generate(_req(method))
    handles = engine.loop.submit_group([_req(method) for _ in range(3)])
    results = [h.result(60) for h in handles]
    assert [r.token_ids for r in results] == [alone.token_ids] * 3
    seeded = [h.result(60) for h in engine.loop.submit_group(
        [_req(method, temperature=1.0, seed=s, max_new_tokens=12) for s in (1, 2, 1)])]
    assert seeded[0].token_ids == seeded[2].token_ids != seeded[1].token_ids


def test_paged_followers_take_the_leaders_prompt_blocks(engine):
    """One prefill: the followers' admission finds every full prompt block cached."""
    prompt_len = len(engine.prompt(_req()).ids)
    handles = engine.loop.submit_group([_req(max_new_tokens=6) for _ in range(4)])
    results = [h.result(60) for h in handles]
    full_blocks = (prompt_len - 1) // 4 * 4
    assert results[0].usage.cached_tokens == 0
    assert [r.usage.cached_tokens for r in results[1:]] == [full_blocks] * 3
    stats = engine.loop.call(lambda: engine.loop.paged.snapshot())
    # the leader's prompt ran once; each follower only its tail past the last full block
    assert stats["tokens_computed"] == prompt_len + 3 * (prompt_len - full_blocks) + 4 * 5


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("stop", [(), ("o",)])
def test_streamed_logprobs_arrive_with_their_text(engine, method, stop):
    """Each piece comes after the entries of exactly the tokens whose text it completes
    (with a stop string, text may lag behind: never a token's entry behind its text)."""
    pieces: list[tuple[str, list]] = []
    pending: list = []
    handle = engine.loop.submit(_req(method, logprobs=True, top_logprobs=2, max_new_tokens=16, stop=stop))
    result = handle.stream(on_text=lambda text: pieces.append((text, list(pending))) or pending.clear(),
                           on_logprobs=pending.extend)
    assert [e for _, entries in pieces for e in entries] + pending == result.logprobs
    decode = engine.loaded.tokenizer.decode
    emitted, sent = "", []
    for text, entries in pieces:
        emitted += text
        sent += [e["token_id"] for e in entries]
        if stop:
            assert emitted.startswith(decode(sent))
        else:
            assert decode(sent) == emitted
    assert len(pieces) > 1


def test_prompt_logprobs_match_a_transformers_forward(engine):
    request = _req(max_new_tokens=2, prompt_logprobs=3)
    result = engine.generate(request)
    ids = engine.prompt(request).ids
    entries = result.prompt_logprobs
    assert [e["token_id"] for e in entries] == ids and entries[0]["logprob"] is None
    with torch.inference_mode():
        logits = engine.loaded.model(torch.tensor([ids])).logits[0].float()
    expected = torch.log_softmax(logits, dim=-1)
    for position, entry in enumerate(entries[1:], start=1):
        assert entry["logprob"] == pytest.approx(float(expected[position - 1, ids[position]]), abs=1e-4)
        top_ids = [i for i, _ in entry["top"]]
        assert top_ids == torch.topk(expected[position - 1], 3).indices.tolist()
