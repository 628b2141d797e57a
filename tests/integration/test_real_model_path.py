"""One bounded run of the real default model through the whole path (slow, runs in CI).

Both sides run unquantized: ``official`` runs the full-precision weights under every setting
(a q8 worker reloads them for it), so q8 would only add two quantizations of the model (about
10 s each on a quiet CPU) to what this compares. tests/quant covers q8 on the default model."""
from __future__ import annotations

import pytest
import redis

from core.jobs import JobStore
from core.settings import load_settings
from tests.harness.client import submit_and_follow
from tests.harness.stack import Stack
from tests.integration.conftest import wait_for_worker

pytestmark = [pytest.mark.integration, pytest.mark.slow]
PROMPT = "What is the capital of France? Answer in one word."


def test_greedy_generation_through_queue_equals_direct_engine_call(redis_proc):
    from engine.engine import Engine
    from engine.types import GenerationRequest, SamplingParams

    _, url = redis_proc
    redis.Redis.from_url(url).flushall()
    stack = Stack(redis_url=url, env_overrides={"MINISERVE_MODEL": "default", "MINISERVE_THREADS": "1",
                                                "MINISERVE_QUANT": "none"})
    store = JobStore(redis.Redis.from_url(url, decode_responses=True))
    worker = stack.start_worker()
    web, base_url = stack.start_web()
    try:
        wait_for_worker(store, timeout_s=180)
        trace = submit_and_follow(base_url, {"prompt": PROMPT, "max_new_tokens": 12,
                                             "generation_method": "official",
                                             "return_token_ids": True}, timeout_s=120)
        queued = store.get(trace.job_id).result
    finally:  # teardown: no graceful stop is under test here
        web.kill()
        worker.kill()
    engine = Engine(load_settings(model="default", threads=1, quant="none"))
    try:
        direct = engine.generate(GenerationRequest(messages=[{"role": "user", "content": PROMPT}], method="official",
                                                   sampling=SamplingParams(max_new_tokens=12)))
    finally:
        engine.close()
    assert trace.terminal == "done" and queued["text"].strip()
    assert trace.text == queued["text"]
    assert queued["token_ids"] == direct.token_ids
