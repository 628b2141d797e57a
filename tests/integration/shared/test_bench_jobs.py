"""Benchmark jobs through the queue: measured on the worker, the summary is the job result."""
from __future__ import annotations

import pytest
import requests

from core.events import SUCCEEDED
from tests.integration.conftest import wait_terminal

pytestmark = pytest.mark.integration


def test_generation_methods_benchmark_job(web, worker, store):
    reply = requests.post(f"{web}/bench", json={"benchmark": "generation_methods", "prompt": "Hello",
                                                "max_new_tokens": 8})
    assert reply.status_code == 202, reply.text
    record = wait_terminal(store, reply.json()["id"], 120)
    assert record.type == "bench" and record.queue == "bench" and record.state == SUCCEEDED, record.error
    methods = [row["method"] for row in record.result["methods"]]
    assert {"official", "no_cache", "custom_cache", "prefix_cache", "paged"} <= set(methods)
    assert record.result["identical"] is True  # greedy: every method writes the same tokens
    progress = [e.data for e in store.events(record.id) if e.type == "progress"]
    assert [p["done"] for p in progress] == list(range(1, len(methods) + 1))


def test_agent_eval_benchmark_job(web, worker, store):
    reply = requests.post(f"{web}/bench", json={"benchmark": "agent_eval", "categories": ["calculator"],
                                                "limit": 2, "max_new_tokens": 16})
    assert reply.status_code == 202, reply.text
    record = wait_terminal(store, reply.json()["id"], 180)
    assert record.state == SUCCEEDED, record.error
    assert len(record.result["records"]) == 2
    summary = record.result["summary"]
    assert summary["overall"]["cases"] == 2 and list(summary["categories"]) == ["calculator"]
    # the safeguard runs the prompt's own expression even when the tiny model writes noise
    assert summary["overall"]["routing"] is not None


def test_bench_body_is_validated(web, store):
    for body in ({"benchmark": "nope"}, {"benchmark": "generation_methods", "prompt": ""},
                 {"benchmark": "agent_eval", "categories": ["poetry"]}, {"benchmark": "agent_eval", "limit": 0},
                 {"benchmark": "agent_eval", "surprise": True}):
        assert requests.post(f"{web}/bench", json=body).status_code == 422, body
