"""A job of several choices on the worker (fakeredis job store, tiny model): one request per
choice with seed + j, token events tagged with their choice and carrying their tokens'
log-probabilities, and one job result whose usage counts each prompt once."""
from __future__ import annotations

import time
from types import SimpleNamespace

import fakeredis
import pytest

from core.events import TOKEN
from core.jobs import JobStore
from core.settings import load_settings
from tests.tiny_model import tiny_model_dir  # noqa: F401  (fixture)
from worker.choices import group_result
from worker.job_runner import BadJobRequest, JobContext
from worker.requests import group_from
from worker.tasks import WorkerGenerator

SAMPLING = {"max_new_tokens": 6, "temperature": 1.0, "top_p": 1.0, "top_k": 0, "repetition_penalty": None,
            "seed": 7, "stop": [], "logprobs": True, "top_logprobs": 1}


@pytest.fixture(scope="module")
def engine(tiny_model_dir):  # noqa: F811
    from engine.engine import Engine

    eng = Engine(load_settings(model=str(tiny_model_dir), dtype="float32", device="cpu", quant="none",
                               kv_block_size=4))
    yield eng
    eng.close()


def _context(store, request):
    job = store.create("completion", "generation", request)
    started = store.start_attempt(job.id, "w1", lease_s=30)
    return JobContext(store, store.get(job.id), started.attempt, deadline=time.monotonic() + 60)


def test_group_from_gives_one_request_per_choice_prompt_major():
    stored = {"prompts": ["a b", "c d"], "n": 3, "method": "paged",
              "sampling": {**SAMPLING, "prompt_logprobs": 2}}
    requests = group_from(stored, 8)
    assert [r.raw_prompt for r in requests] == ["a b"] * 3 + ["c d"] * 3
    assert [r.sampling.seed for r in requests] == [7, 8, 9] * 2
    assert [r.sampling.prompt_logprobs for r in requests] == [2, None, None] * 2
    assert len(group_from({"messages": [{"role": "user", "content": "x"}]}, 8)) == 1
    for bad in ({"prompts": []}, {"prompts": ["x", 3]}, {"prompts": ["x"], "n": 0}, {"prompts": ["x"], "n": True}):
        with pytest.raises(BadJobRequest):
            group_from(bad, 8)


@pytest.mark.parametrize("method", ["paged", "custom_cache"])
def test_a_group_job_streams_each_choice_with_its_logprobs(engine, method):
    store = JobStore(fakeredis.FakeRedis(decode_responses=True), ttl_s=60)
    stored = {"prompts": ["Hello, world! How are", "The quick brown fox jumps"], "n": 2, "method": method,
              "sampling": {**SAMPLING, "prompt_logprobs": 0}}
    ctx = _context(store, stored)
    requests = group_from(stored, 8)
    results = WorkerGenerator(SimpleNamespace(engine=engine), ctx).generate_group(
        requests, ctx.on_choice_text, ctx.on_choice_logprobs, ctx.should_cancel)
    ctx.flush_text()
    payload = group_result(results, 2)
    events = [e.data for e in store.events(ctx.job_id) if e.type == TOKEN]
    for choice in payload["choices"]:
        mine = [d for d in events if d.get("index", 0) == choice["index"]]
        assert "".join(d["text"] for d in mine) == choice["text"]
        assert [e for d in mine for e in d.get("logprobs", [])] == choice["logprobs"]
        assert choice["prompt_index"] == choice["index"] // 2
        assert choice["prompt_logprobs"][0]["logprob"] is None
    prompt_lens = [len(engine.prompt(r).ids) for r in requests[::2]]
    usage = payload["usage"]
    assert usage["prompt_tokens"] == sum(prompt_lens)
    assert usage["completion_tokens"] == sum(c["usage"]["completion_tokens"] for c in payload["choices"])
    assert payload["text"] == payload["choices"][0]["text"]
