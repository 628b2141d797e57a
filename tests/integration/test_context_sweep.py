"""No input is a 5xx, and nothing accepted is lost: a sweep of prompt lengths from one word to
past the limit, with ``max_tokens`` up to the cap, against a real worker whose paged KV pool
is smaller than the model's context. The web takes the smaller of the two as the limit (the
pool size comes from the worker's heartbeat), so every request it accepts fits the pool, and
every other one is a 4xx naming the limit."""
from __future__ import annotations

import pytest
import requests

from core.events import SUCCEEDED
from tests.integration.conftest import _clean_stack, _started_worker, started_web, stack_store

POOL = {"MINISERVE_KV_NUM_BLOCKS": "12", "MINISERVE_KV_BLOCK_SIZE": "8"}  # 96 tokens
CAP = 48
LIMITS = {**POOL, "MINISERVE_MAX_NEW_TOKENS_CAP": str(CAP)}


@pytest.fixture(scope="module")
def sweep_stack(redis_proc, tiny_model):
    return _clean_stack(redis_proc, tiny_model)


@pytest.fixture(scope="module")
def base_url(sweep_stack):
    store = stack_store(sweep_stack)
    worker = _started_worker(sweep_stack, store, **LIMITS)
    web, url = started_web(sweep_stack, **LIMITS)
    yield url
    web.kill()  # teardown: no graceful stop is under test here
    worker.kill()  # teardown: no graceful stop is under test here


def _chat(base_url: str, words: int, max_tokens: int) -> requests.Response:
    body = {"messages": [{"role": "user", "content": " ".join(["token"] * words)}], "max_tokens": max_tokens,
            "temperature": 0, "ignore_eos": True}
    return requests.post(f"{base_url}/v1/chat/completions", json=body, timeout=120)


def test_every_prompt_length_is_answered_or_refused_with_a_4xx_and_nothing_is_lost(base_url, sweep_stack):
    store = stack_store(sweep_stack)
    answered, refused = 0, 0
    for words in (1, 4, 16, 30, 45, 60, 80, 100, 140):
        for max_tokens in (1, CAP // 2, CAP):
            reply = _chat(base_url, words, max_tokens)
            assert reply.status_code in (200, 400, 413, 422), (words, max_tokens, reply.text)
            if reply.status_code == 200:
                answered += 1
                job = store.get(reply.headers["X-Job-Id"])
                assert job.state == SUCCEEDED
                assert reply.json()["usage"]["completion_tokens"] == max_tokens  # ignore_eos: the whole budget
            else:
                refused += 1
                error = reply.json()["error"]
                assert error["code"] in ("prompt_too_long", "context_exceeded") and "96" in error["message"], error
    assert answered and refused  # the sweep crossed the limit
    jobs = store.list(limit=200)
    assert all(job.state == SUCCEEDED for job in jobs) and len(jobs) == answered
