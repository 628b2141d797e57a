"""``official`` under q8 reloads the freed full weights on a loader thread: the loop's other
streams keep decoding meanwhile, and the weights are freed again after.

The paged stream's progress is read where the loop makes it, on the loop thread
(:mod:`tests.accepted_tokens`), not where a consumer thread takes its text. The test heap is
frozen out of the garbage collector meanwhile: late in a full run a collection over hundreds
of tests' objects stops every thread of the process.
"""
from __future__ import annotations

import gc
import threading
import time

import engine.quant.restore as restore
from core.settings import load_settings
from engine.engine import Engine
from engine.quant.restore import full_weight_bytes
from engine.types import GenerationRequest, SamplingParams
from tests.accepted_tokens import record_accepted

READ_S = 1.0  # a slow disk: long beside the tiny model's decode step of a few milliseconds


def _request(method: str, tokens: int) -> GenerationRequest:
    return GenerationRequest(messages=[{"role": "user", "content": "Count from one to fifty."}], method=method,
                             sampling=SamplingParams(max_new_tokens=tokens, temperature=0.0))


def test_the_reload_runs_beside_the_batch_not_on_the_loop(quant_model_dir, tmp_path, monkeypatch):
    engine = Engine(load_settings(model=str(quant_model_dir), device="cpu", dtype="float32", quant="q8",
                                  cache_dir=tmp_path, threads=1)).load()
    reads: list[tuple[int, float, float]] = []  # (thread, start, end) of each read of the files
    load = restore._load

    def slow_load(*args):
        start = time.perf_counter()
        time.sleep(READ_S)
        out = load(*args)
        reads.append((threading.get_ident(), start, time.perf_counter()))
        return out
    monkeypatch.setattr(restore, "_load", slow_load)
    accepted = record_accepted(monkeypatch)
    gc.collect()
    gc.freeze()
    try:
        model = engine.loaded.model
        assert full_weight_bytes(model) == 0
        streaming = engine.loop.submit(_request("paged", 1500))
        while not accepted:
            time.sleep(0.01)
        official = engine.generate(_request("official", 4))
        assert official.usage.completion_tokens == 4
        assert full_weight_bytes(model) == 0  # freed again once official ended
        [(thread, start, end)] = reads
        stamps = [token.at for token in accepted if token.method == "paged"]
        assert thread != engine.loop.owner
        # the paged stream went on through the read: a loop held by it gives no token in it (a
        # quiet machine gives hundreds; a loaded one running the suite's other process, ~10)
        before = [t for t in stamps if t <= start]
        during = [t for t in stamps if start + 0.1 < t < end - 0.1]
        assert len(during) >= 5, f"paged tokens before the read {len(before)}, in it {len(during)}, in all {len(stamps)}"
        streaming.cancel()
        streaming.result(timeout=60)
    finally:
        gc.unfreeze()
        engine.close()
