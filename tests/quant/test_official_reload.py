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

import engine.quant.restore as restore
from core.settings import load_settings
from engine.engine import Engine
from engine.quant.restore import full_weight_bytes
from engine.run import GenerationRun
from engine.types import GenerationRequest, SamplingParams
from tests.accepted_tokens import record_accepted

SAFETY_S = 30  # a safety net only: each wait ends as soon as what it waits for happens
DURING = 5  # paged tokens the loop must make while the read is held


def _request(method: str, tokens: int) -> GenerationRequest:
    return GenerationRequest(messages=[{"role": "user", "content": "Count from one to fifty."}], method=method,
                             sampling=SamplingParams(max_new_tokens=tokens, temperature=0.0, ignore_eos=True))


def test_the_reload_runs_beside_the_batch_not_on_the_loop(quant_model_dir, tmp_path, monkeypatch):
    """The read of the full weights is held (a gate, as a slow disk) until the loop has made
    ``DURING`` paged tokens: a loop blocked by the read makes none, and the wait fails."""
    engine = Engine(load_settings(model=str(quant_model_dir), device="cpu", dtype="float32", quant="q8",
                                  cache_dir=tmp_path, threads=1)).load()
    readers: list[int] = []
    reading, enough = threading.Event(), threading.Event()
    load = restore._load

    def held_load(*args):
        readers.append(threading.get_ident())
        reading.set()
        enough.wait(SAFETY_S)  # a slow disk, for exactly as long as the test needs
        return load(*args)
    monkeypatch.setattr(restore, "_load", held_load)
    accepted = record_accepted(monkeypatch)
    during: list[str] = []
    accept = GenerationRun.accept

    def counting(run: GenerationRun, token_id: int) -> bool:
        if run.method == "paged" and reading.is_set() and not enough.is_set():
            during.append(run.method)
            if len(during) >= DURING:
                enough.set()
        return accept(run, token_id)
    monkeypatch.setattr(GenerationRun, "accept", counting)
    gc.collect()
    gc.freeze()
    try:
        model = engine.loaded.model
        assert full_weight_bytes(model) == 0
        gate = threading.Event()
        engine.loop.post(gate.wait)            # both queued before the loop turns: the stream runs first
        streaming = engine.loop.submit(_request("paged", 1500))
        official = engine.loop.submit(_request("official", 4))
        gate.set()
        assert official.result(timeout=SAFETY_S * 2).usage.completion_tokens == 4
        assert full_weight_bytes(model) == 0  # freed again once official ended
        assert len(readers) == 1 and readers[0] != engine.loop.owner
        assert enough.is_set() and len(during) == DURING  # the paged stream went on through the read
        assert any(token.method == "paged" for token in accepted)
        streaming.cancel()
        streaming.result(timeout=SAFETY_S * 2)
    finally:
        gc.unfreeze()
        engine.close()
