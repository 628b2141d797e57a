"""The Batch API against separate calls: the same chat requests sent as one batch
(``/v1/files`` + ``/v1/batches``, polled until completed) and as separate
``/v1/chat/completions`` calls from a pool of clients. Run as a mode of the queue benchmark::

    python -m bench queue_overhead --batch-api [--burst 200] [--batch-clients 8] [--workers 2]

Each way gets its own prompts (same lengths), so neither finds the other's prefixes cached.
Writes results/batch_api.json.
"""
from __future__ import annotations

import concurrent.futures as futures
import json
import time
from pathlib import Path
from typing import Any

import requests

from bench.stats import machine_info, write_json
from tests.harness.stack import wait_until

TOPICS = ("rivers", "mountains", "birds", "trees", "stars", "islands", "metals", "insects")


def bodies(count: int, tag: str, max_tokens: int) -> list[dict[str, Any]]:
    return [{"max_tokens": max_tokens,
             "messages": [{"role": "user", "content": f"[{tag}{i:04d}] Name three {TOPICS[i % len(TOPICS)]}."}]}
            for i in range(count)]


def separate_calls(base_url: str, items: list[dict[str, Any]], clients: int) -> dict[str, Any]:
    session = requests.Session()

    def call(body: dict[str, Any]) -> int:
        return session.post(f"{base_url}/v1/chat/completions", json=body, timeout=600).status_code

    started = time.perf_counter()
    with futures.ThreadPoolExecutor(clients) as pool:
        codes = list(pool.map(call, items))
    elapsed = time.perf_counter() - started
    return {"requests": len(items), "clients": clients, "seconds": round(elapsed, 2),
            "requests_per_s": round(len(items) / elapsed, 2), "succeeded": codes.count(200)}


def one_batch(base_url: str, items: list[dict[str, Any]]) -> dict[str, Any]:
    lines = "".join(json.dumps({"custom_id": f"b{i}", "method": "POST", "url": "/v1/chat/completions",
                                "body": body}) + "\n" for i, body in enumerate(items))
    started = time.perf_counter()
    file_id = requests.post(f"{base_url}/v1/files", data={"purpose": "batch"},
                            files={"file": ("bench.jsonl", lines.encode())}, timeout=60).json()["id"]
    batch = requests.post(f"{base_url}/v1/batches", json={"input_file_id": file_id, "completion_window": "24h",
                                                          "endpoint": "/v1/chat/completions"}, timeout=600).json()
    submitted = time.perf_counter() - started
    state: dict[str, Any] = {}

    def ended() -> bool:
        state.update(requests.get(f"{base_url}/v1/batches/{batch['id']}", timeout=60).json())
        return state["status"] in ("completed", "failed", "cancelled", "expired")

    wait_until(ended, 3600, interval_s=0.2, what="the batch")
    elapsed = time.perf_counter() - started
    output = requests.get(f"{base_url}/v1/files/{state['output_file_id']}/content", timeout=60).text
    return {"requests": len(items), "seconds": round(elapsed, 2), "submit_seconds": round(submitted, 2),
            "requests_per_s": round(len(items) / elapsed, 2), "status": state["status"],
            "succeeded": state["request_counts"]["completed"], "output_lines": len(output.splitlines())}


def compare(base_url: str, count: int, clients: int, max_tokens: int, output: Path) -> dict[str, Any]:
    result = {"separate": separate_calls(base_url, bodies(count, "s", max_tokens), clients),
              "batch": one_batch(base_url, bodies(count, "b", max_tokens))}
    result["batch_over_separate"] = round(result["batch"]["requests_per_s"] / result["separate"]["requests_per_s"], 2)
    print(json.dumps(result, indent=2))
    write_json(output, {"max_tokens": max_tokens, "machine": machine_info(), **result})
    return result
