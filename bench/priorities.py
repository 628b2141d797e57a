"""An interactive chat beside a running Batch API file, with the fair gate on and off. Run
as a mode of the queue benchmark::

    python -m bench queue_overhead --priorities [--batch-lines 400] [--probes 6] [--max-new-tokens 16]

For each setting (the gate with its defaults; the gate without a reserved slot,
``MINISERVE_RESERVED_SLOTS=0``; no gate, ``MINISERVE_QUEUE_WINDOW=0``: plain FIFO) a fresh stack (redis-server, one worker of the production pool, the web) first answers
``--probes`` streamed chats alone (time to first token, after a warmup), then gets a batch of
``--batch-lines`` chat lines and, once the batch has started, the same chats again, one at a
time. Without the gate a chat waits behind every line sent before it; with it, the chat's
class (``interactive``) goes before the held ``batch`` lines. The batch is then cancelled.
Writes results/priorities.json: p50 TTFT alone and beside the batch, and their ratio.
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import requests

from bench.batch_api import bodies
from bench.stats import machine_info, write_json
from tests.harness.stack import wait_until

PROBE = {"messages": [{"role": "user", "content": "Say hello in five words."}], "stream": True}
PROBE_TIMEOUT_S = 900


@dataclass(frozen=True)
class Probe:
    """One chat: the client's time to first token, and the job's own split of it (the wait
    from accepted to started, and the engine's time to first token once started)."""

    ttft_s: float
    queue_wait_s: float
    engine_ttft_s: float


def ttft(base_url: str, max_tokens: int) -> Probe:
    """Seconds from the request to the first streamed content of one chat."""
    started = time.perf_counter()
    first, job_id = None, ""
    with requests.post(f"{base_url}/v1/chat/completions", json={**PROBE, "max_tokens": max_tokens},
                       stream=True, timeout=PROBE_TIMEOUT_S) as response:
        response.raise_for_status()
        for raw in response.iter_lines():
            if not raw.startswith(b"data: {"):
                continue
            chunk = json.loads(raw[6:])
            job_id = job_id or chunk.get("id", "").removeprefix("chatcmpl-")
            if first is None and any(c.get("delta", {}).get("content") for c in chunk.get("choices", [])):
                first = time.perf_counter() - started
    if first is None:
        raise RuntimeError("the chat streamed no content")
    timings = requests.get(f"{base_url}/jobs/{job_id}", timeout=60).json().get("timings", {})
    return Probe(first, timings.get("queue_wait_s", float("nan")), timings.get("ttft_s", float("nan")))


def p50(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[len(ordered) // 2]


def start_batch(base_url: str, lines: int, max_tokens: int) -> str:
    text = "".join(json.dumps({"custom_id": f"b{i}", "method": "POST", "url": "/v1/chat/completions",
                               "body": body}) + "\n" for i, body in enumerate(bodies(lines, "p", max_tokens)))
    file_id = requests.post(f"{base_url}/v1/files", data={"purpose": "batch"},
                            files={"file": ("priorities.jsonl", text.encode())}, timeout=120).json()["id"]
    batch = requests.post(f"{base_url}/v1/batches", json={"input_file_id": file_id, "completion_window": "24h",
                                                          "endpoint": "/v1/chat/completions"}, timeout=600).json()
    return batch["id"]


def batch_counts(base_url: str, batch_id: str) -> dict[str, int]:
    return requests.get(f"{base_url}/v1/batches/{batch_id}", timeout=60).json()["request_counts"]


def one_setting(base_url: str, window: int, reserved: int, lines: int, probes: int,
                max_tokens: int) -> dict[str, Any]:
    for _ in range(2):  # warmup: the first chats pay for lazy loads
        ttft(base_url, max_tokens)
    alone_probes = [ttft(base_url, max_tokens) for _ in range(probes)]
    alone = [p.ttft_s for p in alone_probes]
    batch_id = start_batch(base_url, lines, max_tokens)
    wait_until(lambda: batch_counts(base_url, batch_id)["completed"] >= 1, 600, interval_s=0.2,
               what="the batch's first line")
    beside_probes = [ttft(base_url, max_tokens) for _ in range(probes if window else 1)]  # FIFO: one wait is enough
    beside = [p.ttft_s for p in beside_probes]
    done_before_cancel = batch_counts(base_url, batch_id)["completed"]
    requests.post(f"{base_url}/v1/batches/{batch_id}/cancel", timeout=60)
    return {"queue_window": window, "reserved_slots": reserved, "probes": len(beside), "ttft_alone_p50_s": round(p50(alone), 3),
            "ttft_beside_batch_p50_s": round(p50(beside), 3),
            "ratio": round(p50(beside) / p50(alone), 2), "batch_lines_done_before_cancel": done_before_cancel,
            "beside_queue_wait_p50_s": round(p50([p.queue_wait_s for p in beside_probes]), 3),
            "beside_engine_ttft_p50_s": round(p50([p.engine_ttft_s for p in beside_probes]), 3),
            "alone_queue_wait_p50_s": round(p50([p.queue_wait_s for p in alone_probes]), 3),
            "alone_engine_ttft_p50_s": round(p50([p.engine_ttft_s for p in alone_probes]), 3)}


SETTINGS = ((2, 1), (2, 0), (0, 0))  # (MINISERVE_QUEUE_WINDOW, MINISERVE_RESERVED_SLOTS)


def compare(stack_for: Callable[[int, int], Any], lines: int, probes: int, max_tokens: int,
            output: Path) -> list[dict[str, Any]]:
    """``stack_for(window, reserved)``: a context manager that yields a ready stack's base URL."""
    rows = []
    for window, reserved in SETTINGS:
        with stack_for(window, reserved) as base_url:
            rows.append(one_setting(base_url, window, reserved, lines, probes, max_tokens))
        print(json.dumps(rows[-1]))
    write_json(output, {"batch_lines": lines, "max_tokens": max_tokens, "machine": machine_info(), "rows": rows})
    return rows
