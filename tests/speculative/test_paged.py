"""Speculative decoding inside the paged batching scheduler: each sequence verifies its own
drafts in the shared batched step; greedy tokens equal speculation off (fp32), the token
budget counts drafts, blocks and reference counts come back clean, preemption is safe."""
from __future__ import annotations

import pytest

from core.settings import load_settings
from engine.batching import Scheduler
from engine.handwritten import forward_for
from engine.run import GenerationRun
from engine.types import GenerationRequest, SamplingParams

PROMPTS = [
    "Rename foo to bar: def foo(x): return foo(x - 1) + foo(x - 2)\ndef foo(x): return foo(x - 1)",
    "你好 world, compute 12 * 3 please",
    "Quote the note: the quick brown fox jumps over the lazy dog. the quick brown fox",
    "Write a short poem about the sea.",
    '{"name": "calculator", "arguments": {"expression": "2 + 2"}} reformat {"name": "calculator"}',
    "请用中文回答这个问题：大语言模型是什么？",
]


def _service(engine, **overrides) -> Scheduler:
    settings = load_settings(**{**engine.settings.model_dump(), **overrides})
    return Scheduler.for_model(forward_for(engine), settings)


def _seq(service, engine, text, speculative, **sampling):
    sampling.setdefault("max_new_tokens", 24)
    request = GenerationRequest(messages=[{"role": "user", "content": text}], method="paged",
                                sampling=SamplingParams(**sampling), speculative=speculative)
    prompt = engine.prompt(request)
    pieces: list[str] = []
    run = GenerationRun(engine.loaded.tokenizer, method="paged", max_new_tokens=request.sampling.max_new_tokens,
                        eos_ids=engine.loaded.eos_ids, stops=request.sampling.stop, on_text=pieces.append)
    seq = service.new_sequence(prompt.ids, run, request.sampling, engine.loaded.default_repetition_penalty,
                               speculative=speculative)
    seq.pieces = pieces
    return seq


def _drive(service, seqs, budget=None):
    for seq in seqs:
        service.submit(seq)
    steps = 0
    while not all(seq.finished for seq in seqs):
        service.step()
        steps += 1
        if budget is not None:
            assert service.stats.last_num_tokens <= budget
        assert steps < 2000
    for seq in seqs:
        assert seq.error is None, seq.error
    return [(seq.run.result(prompt_tokens=len(seq.prompt_ids)), seq.pieces) for seq in seqs], steps


def _assert_pool_clean(service):
    stats = service.blocks.stats()
    assert stats.blocks_used == 0 and stats.sequences == 0
    assert stats.blocks_free + stats.blocks_cached == stats.num_blocks
    assert all(service.blocks.ref_count(b) == 0 for b in range(stats.num_blocks))


def test_one_sequence_greedy_identical_and_fewer_steps(spec_engine, tiny_engine):
    service = _service(spec_engine)
    off, off_steps = _drive(service, [_seq(service, spec_engine, PROMPTS[0], False, max_new_tokens=40)])
    on, on_steps = _drive(service, [_seq(service, spec_engine, PROMPTS[0], True, max_new_tokens=40)])
    assert on[0][0].token_ids == off[0][0].token_ids and on[0][1] == off[0][1]
    assert on[0][0].usage.accepted_draft_tokens > 0 and on_steps < off_steps
    # the same weights through another engine (this one's state is driven by the test thread)
    solo = tiny_engine.generate(GenerationRequest(messages=[{"role": "user", "content": PROMPTS[0]}],
                                                  method="custom_cache", speculative=False,
                                                  sampling=SamplingParams(max_new_tokens=40)))
    assert solo.token_ids == off[0][0].token_ids
    _assert_pool_clean(service)


@pytest.mark.parametrize("budget,blocks", [(64, 512), (7, 512), (64, 60)])
def test_a_mixed_batch_matches_speculation_off(spec_engine, budget, blocks):
    """Greedy and stop-string requests together; a tight token budget; a small pool that
    forces preemptions (drafts never cause one, and recomputation stays exact)."""
    extra = [dict(), dict(stop=("the",)), dict(max_new_tokens=5), dict(), dict(repetition_penalty=1.0), dict()]
    reference = _service(spec_engine)
    expected, _ = _drive(reference, [_seq(reference, spec_engine, p, False, **x) for p, x in zip(PROMPTS, extra)])
    service = _service(spec_engine, max_batched_tokens=budget, kv_num_blocks=blocks)
    got, _ = _drive(service, [_seq(service, spec_engine, p, True, **x) for p, x in zip(PROMPTS, extra)],
                    budget=budget)
    for (want, want_pieces), (have, have_pieces) in zip(expected, got):
        assert have.token_ids == want.token_ids and have_pieces == want_pieces
        assert have.finish_reason == want.finish_reason
    stats = service.stats
    assert stats.draft_tokens > 0 and 0 < stats.accepted_draft_tokens <= stats.draft_tokens
    assert sum(r.usage.draft_tokens for r, _ in got) == stats.draft_tokens
    if blocks == 60:
        assert stats.preemptions > 0
    _assert_pool_clean(service)


def test_finished_sequences_leave_only_final_tokens_hashed(spec_engine):
    """After speculative runs, every cached block's tokens are a prefix of a real sequence."""
    service = _service(spec_engine)
    seqs = [_seq(service, spec_engine, p, True, max_new_tokens=30) for p in PROMPTS[:3]]
    _drive(service, seqs)
    finals = [tuple(seq.tokens) for seq in seqs]
    bs = service.blocks.block_size
    for block in service.blocks._blocks:
        if block.hash is None:
            continue
        assert any(block.token_ids in {f[i:i + bs] for i in range(0, len(f) - bs + 1, bs)} for f in finals)


def test_cancel_and_mixed_flags(spec_engine):
    service = _service(spec_engine)
    seqs = [_seq(service, spec_engine, PROMPTS[0], True, max_new_tokens=40),
            _seq(service, spec_engine, PROMPTS[2], None, max_new_tokens=40),
            _seq(service, spec_engine, PROMPTS[0], False, max_new_tokens=40)]
    calls = [0]

    def cancel_soon():
        calls[0] += 1
        return calls[0] > 6

    seqs[0].run._should_cancel = cancel_soon
    results, _ = _drive(service, seqs)
    assert results[0][0].finish_reason == "cancelled" and len(results[0][0].token_ids) <= 6
    assert results[1][0].usage.draft_tokens == 0        # the setting is off for this engine
    assert results[2][0].usage.draft_tokens == 0
    _assert_pool_clean(service)
