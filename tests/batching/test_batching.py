"""Continuous batching on a tiny model: every sequence of a mixed batch equals its solo run."""
from __future__ import annotations

import threading

from core.settings import load_settings
from engine.batching import Scheduler
from engine.handwritten import forward_for
from engine.loop import EngineLoop
from engine.run import GenerationRun
from engine.types import GenerationRequest, SamplingParams

QUESTIONS = ["Hello, world!", "Please compute 12 * (3 + 4) and explain the steps.",
             "你好，世界！今天天气很好。我们一起去公园散步吧。",
             "Write a short poem about the sea, the wind and the stars at night. " * 4,
             "The answer is 84.", "def add(a, b):\n    return a + b\n", "Emoji test: 😀 🚀 ✨",
             "北京是中国的首都。"]


def request(text: str, method: str = "paged", **sampling) -> GenerationRequest:
    params = SamplingParams(**{"max_new_tokens": 20, **sampling})
    return GenerationRequest(messages=[{"role": "user", "content": text}], sampling=params,
                             method=method)


def _forward(engine):
    """The engine's forward, fetched on its loop thread (it owns engine state); a second
    loop over it only reads the weights."""
    return engine.loop.call(lambda: forward_for(engine))


class Collector:
    """on_text + should_cancel for one job; cancels after ``cancel_after`` pieces."""

    def __init__(self, cancel_after: int | None = None):
        self.pieces: list[str] = []
        self.cancel_after = cancel_after

    def on_text(self, piece: str) -> None:
        self.pieces.append(piece)

    def should_cancel(self) -> bool:
        return self.cancel_after is not None and len(self.pieces) >= self.cancel_after


def test_mixed_batch_equals_solo_runs(paged_engine):
    plans = [(QUESTIONS[0], {}, None), (QUESTIONS[1], {"max_new_tokens": 7}, None),
             (QUESTIONS[2], {"max_new_tokens": 120}, 3), (QUESTIONS[3], {"max_new_tokens": 12}, None),
             (QUESTIONS[4], {}, None), (QUESTIONS[5], {"max_new_tokens": 30}, None)]
    # a stop string taken from the solo output of plan 4
    probe = paged_engine.generate(request(QUESTIONS[4], "official"))
    assert len(probe.text) > 6
    plans[4] = (QUESTIONS[4], {"stop": (probe.text[4:6],)}, None)
    solo = []
    for text, sampling, cancel_after in plans:
        col = Collector(cancel_after)
        solo.append((paged_engine.generate(request(text, **sampling), col.on_text,
                                           col.should_cancel), col))
    # every prompt admitted in the first step, whole (no throttle beside the decodes): one batch of all six
    service = Scheduler.for_model(_forward(paged_engine), paged_engine.settings.model_copy(
        update={"prefill_tokens_while_decoding": paged_engine.settings.max_batched_tokens}))
    loop = EngineLoop(paged_engine, service)
    gate = threading.Event()
    loop.post(gate.wait)                         # hold the loop: every request joins step 1
    handles, collectors = [], []
    for text, sampling, cancel_after in plans:
        col = Collector(cancel_after)
        collectors.append(col)
        handles.append(loop.submit(request(text, **sampling)))
    gate.set()
    results = [None] * len(plans)

    def consume(i):
        results[i] = handles[i].stream(collectors[i].on_text, collectors[i].should_cancel)

    threads = [threading.Thread(target=consume, args=(i,)) for i in range(len(plans))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    loop.close()
    assert service.stats.max_batch_size >= len(plans)
    for (want, want_col), got, col in zip(solo, results, collectors):
        assert "".join(col.pieces) == got.text            # streamed == result
        if col.cancel_after is not None:   # a cancel reaches the loop a token or two later
            n = min(len(got.token_ids), len(want.token_ids))
            assert got.token_ids[:n] == want.token_ids[:n] and len(col.pieces) >= col.cancel_after
            continue
        assert got.token_ids == want.token_ids
        assert got.text == want.text and got.finish_reason == want.finish_reason
    reasons = [r.finish_reason for r in results]
    assert reasons[2] == "cancelled" and reasons[4] == "stop" and reasons[1] == "length"
    official = paged_engine.generate(request(QUESTIONS[3], "official", max_new_tokens=12))
    assert results[3].token_ids == official.token_ids
    assert service.blocks.stats().blocks_used == 0


def _solo(engine, prompt_ids, max_new):
    service = Scheduler.for_model(_forward(engine), load_settings(
        kv_block_size=4, kv_num_blocks=256, max_batch=1, max_batched_tokens=512))
    return _run(engine, service, [prompt_ids], max_new)[0]


def _run(engine, service, prompts, max_new):
    loaded = engine.loaded
    sampling = SamplingParams(max_new_tokens=max_new)
    seqs, texts = [], []
    for ids in prompts:
        pieces: list[str] = []
        texts.append(pieces)
        run = GenerationRun(loaded.tokenizer, method="paged", max_new_tokens=max_new,
                            eos_ids=[], on_text=pieces.append)
        seq = service.new_sequence(ids, run, sampling, 1.1)
        service.submit(seq)
        seqs.append(seq)
    while service.has_work:
        service.step()
    out = []
    for seq, pieces in zip(seqs, texts):
        result = seq.run.result(prompt_tokens=len(ids))
        assert "".join(pieces) == result.text              # nothing lost or repeated
        out.append(result)
    return out


def test_preemption_under_a_tiny_pool_keeps_outputs(paged_engine):
    prompts = [[5 + i, 17, 9, 44, 2, 91, 7, 7, 12, 5 + 2 * i] for i in range(4)]
    service = Scheduler.for_model(_forward(paged_engine), load_settings(
        kv_block_size=4, kv_num_blocks=16, max_batch=4, max_batched_tokens=64),
        prefix_sharing=False)
    batched = _run(paged_engine, service, prompts, max_new=22)   # 4 x 32 tokens > 64 slots
    assert service.stats.preemptions > 0
    assert service.stats.max_batch_size >= 2
    for ids, got in zip(prompts, batched):
        want = _solo(paged_engine, ids, 22)
        assert got.token_ids == want.token_ids and len(got.token_ids) == 22
    assert service.blocks.stats().blocks_used == 0


def test_request_larger_than_the_pool_fails_alone(paged_engine):
    service = Scheduler.for_model(_forward(paged_engine), load_settings(
        kv_block_size=4, kv_num_blocks=4, max_batch=4, max_batched_tokens=64))
    loop = EngineLoop(paged_engine, service)
    big = loop.submit(request(QUESTIONS[3]))               # prompt > 16 tokens
    try:
        big.result(timeout=30)
        raise AssertionError("expected KVPoolExhausted")
    except Exception as exc:  # noqa: BLE001
        assert type(exc).__name__ == "KVPoolExhausted"
    loop.close()


def test_concurrent_submitters_from_threads(paged_engine):
    loop = paged_engine.loop
    results: dict[int, object] = {}

    def job(i: int) -> None:
        results[i] = loop.generate(request(QUESTIONS[i % len(QUESTIONS)], max_new_tokens=8))

    threads = [threading.Thread(target=job, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    stats = loop.call(loop.stats)            # published after the last step
    assert len(results) == 8
    for i, res in results.items():
        solo = paged_engine.generate(request(QUESTIONS[i % len(QUESTIONS)], "official",
                                             max_new_tokens=8))
        assert res.token_ids == solo.token_ids
    paged = stats["paged"]
    assert paged["running"] == 0 and paged["waiting"] == 0 and paged["blocks"]["blocks_used"] == 0


def test_a_step_returns_what_it_did_and_held_text_waits_for_the_hand_out(paged_engine):
    """The step calls nothing back: it returns the sequences that took tokens and those that
    ended, and a run that holds its output (as the loop's runs do) passes its text on only
    when the caller hands it out."""
    service = Scheduler.for_model(_forward(paged_engine), load_settings(
        kv_block_size=4, kv_num_blocks=64, max_batch=4, max_batched_tokens=64))
    pieces: list[str] = []
    run = GenerationRun(paged_engine.loaded.tokenizer, method="paged", max_new_tokens=6, eos_ids=[],
                        on_text=pieces.append)
    run.defer_output()
    seq = service.new_sequence([5, 17, 9, 44, 2, 91], run, SamplingParams(max_new_tokens=6), 1.0)
    service.submit(seq)
    outputs = []
    while service.has_work:
        before = list(pieces)
        out = service.step()
        assert pieces == before                      # nothing passed on inside the step
        outputs.append(out)
        for streaming in out.streamed:
            streaming.run.hand_out()
    assert [out.finished for out in outputs] == [[]] * (len(outputs) - 1) + [[seq]]
    assert all(out.streamed == [seq] for out in outputs[:-1]) and outputs[-1].streamed == []
    result = run.result(prompt_tokens=6)              # the held tail goes out with the result
    assert "".join(pieces) == result.text and len(result.token_ids) == 6
