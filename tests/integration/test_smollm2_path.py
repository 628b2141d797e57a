"""SmolLM2-135M (the second bundled model) through the whole path: web -> Redis -> Celery worker.

Slow and bounded (few tokens each): an OpenAI chat, a structured output held to a JSON schema,
and an agent run, all on one worker started with ``MINISERVE_MODEL=smollm2-135m``.
"""
from __future__ import annotations

import json

import jsonschema
import pytest
import redis
import requests

from core.jobs import JobStore
from tests.harness.stack import Stack
from tests.integration.conftest import started_web, wait_for_worker

pytestmark = [pytest.mark.integration, pytest.mark.slow]
SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}, "country": {"type": "string"}},
          "required": ["city", "country"], "additionalProperties": False}


@pytest.fixture(scope="module")
def web(redis_proc):
    _, url = redis_proc
    redis.Redis.from_url(url).flushall()
    # float32: under the CPU default (bf16 + q8) the hand-written methods go wrong on this model
    # from the first token (tests/engine/test_smollm2.py holds that case, xfail).
    stack = Stack(redis_url=url, env_overrides={"MINISERVE_MODEL": "smollm2-135m", "MINISERVE_THREADS": "1",
                                                "MINISERVE_DTYPE": "float32", "MINISERVE_JSON_LOGS": "true"})
    worker = stack.start_worker()
    try:
        wait_for_worker(JobStore(redis.Redis.from_url(url, decode_responses=True)), timeout_s=180)
    except TimeoutError:
        worker.kill()
        raise AssertionError("worker did not come up:\n" + worker.log()[-4000:])
    proc, base = started_web(stack)
    yield base
    proc.kill()  # teardown: no graceful stop is under test here
    worker.kill()  # teardown: no graceful stop is under test here


def _chat(base: str, **body) -> dict:
    reply = requests.post(f"{base}/v1/chat/completions", json={"model": "smollm2-135m-instruct", **body}, timeout=120)
    assert reply.status_code == 200, reply.text
    return reply.json()


def test_openai_chat_answers_and_names_the_model(web):
    body = _chat(web, messages=[{"role": "user", "content": "What is the capital of France?"}],
                 max_tokens=12, temperature=0)
    assert body["model"] == "smollm2-135m-instruct"
    assert "Paris" in body["choices"][0]["message"]["content"]
    assert body["usage"]["completion_tokens"] <= 12
    models = requests.get(f"{web}/v1/models", timeout=10).json()
    assert [m["id"] for m in models["data"]] == ["smollm2-135m-instruct"]


def test_json_schema_output_validates(web):
    body = _chat(web, messages=[{"role": "user", "content": "Where is the Eiffel Tower? Answer in JSON."}],
                 max_tokens=40, temperature=0,
                 response_format={"type": "json_schema", "json_schema": {"name": "place", "schema": SCHEMA,
                                                                         "strict": True}})
    choice = body["choices"][0]
    assert choice["finish_reason"] == "stop", choice
    jsonschema.validate(json.loads(choice["message"]["content"]), SCHEMA)


def test_agent_run_ends_with_an_answer_and_its_trace(web):
    reply = requests.post(f"{web}/agent/run", json={"prompt": "Compute 125 * 8 - 37", "max_steps": 2,
                                                    "max_new_tokens": 32}, timeout=180)
    assert reply.status_code == 200, reply.text
    body = reply.json()
    assert isinstance(body["trace"], list) and body["text"].strip()
