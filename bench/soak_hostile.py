"""The soak's hostile clients of the shared-service probe: what one user may do to the others.

Each ``do_<kind>`` is one client action, picked among the hostile share of the mix
(:mod:`bench.soak`); what it must get back is written beside it, and anything else is an
``unexpected`` line in the report:

- ``long_prompt``: a chat whose prompt runs from a few tokens to past the context, with
  ``max_tokens`` up to the cap: a 200 with ``usage``, or a 400 naming the limit, never a 5xx;
- ``v1_stream``: a streamed chat (through the worker kill and the Redis outage): it ends with
  ``[DONE]``, or with an OpenAI error chunk, never just stops;
- ``batch_file``: a Batch API file of a few lines, sometimes with one line over the body cap:
  the upload and ``POST /v1/batches`` answer (or give a 4xx at the file quota), and every batch
  started reaches a terminal state by the end (checked by :func:`batches_ended`);
- ``file_flood``: small uploads until the per-key file quota answers 4xx, then ``DELETE``
  of each: the quota holds and deleting frees it.

A 503 (Redis down) is the documented answer during the outage and never counts against an action.
"""
from __future__ import annotations

import json
import random
import time
from typing import Any

import requests

KINDS = ("long_prompt", "v1_stream", "batch_file", "file_flood")
WORDS = ("queue", "token", "worker", "stream", "cache", "block", "prompt", "answer")
BATCH_END = {"completed", "failed", "cancelled", "expired"}


def _chat(rng: random.Random, words: int, max_tokens: int, stream: bool = False) -> dict[str, Any]:
    text = " ".join(rng.choice(WORDS) for _ in range(words))
    return {"model": "default", "messages": [{"role": "user", "content": text}], "max_tokens": max_tokens,
            "stream": stream}


def do_long_prompt(soak: Any, http: requests.Session, rng: random.Random, name: str) -> None:
    body = _chat(rng, rng.choice([5, 500, 2000, 3500, 4500, 9000]), rng.choice([1, 16, 512, 4096]))
    reply = soak.request(http, "POST", "/v1/chat/completions", json=body)
    if reply.status_code == 200 and "usage" not in reply.json():
        soak.tally.unexpected.append(f"long_prompt 200 without usage: {reply.text[:120]}")
    elif reply.status_code not in (200, 400, 503):
        soak.tally.unexpected.append(f"long_prompt got {reply.status_code}: {reply.text[:120]}")


def do_v1_stream(soak: Any, http: requests.Session, rng: random.Random, name: str) -> None:
    body = _chat(rng, 20, soak.args.max_new_tokens * 4, stream=True)
    with http.post(f"{soak.base}/v1/chat/completions", json=body, stream=True, timeout=300) as reply:
        soak.tally.status(reply.status_code, soak.now())
        if reply.status_code != 200:
            if reply.status_code != 503:
                soak.tally.unexpected.append(f"v1_stream got {reply.status_code}: {reply.text[:120]}")
            return
        ending = _stream_ending(reply)
    if ending == "none":
        soak.tally.unexpected.append("v1_stream ended with neither [DONE] nor an error chunk")


def _stream_ending(reply: requests.Response) -> str:
    """``done``, ``error`` (an error chunk came) or ``none`` (the stream just stopped)."""
    errored = False
    try:
        for line in reply.iter_lines(decode_unicode=True):
            if line == "data: [DONE]":
                return "done"
            if line and line.startswith("data: ") and "error" in json.loads(line[6:]):
                errored = True
    except requests.RequestException:
        return "error" if errored else "none"
    return "error" if errored else "none"


def do_batch_file(soak: Any, http: requests.Session, rng: random.Random, name: str) -> None:
    lines = [{"custom_id": f"{name}-{i}", "method": "POST", "url": "/v1/chat/completions",
              "body": _chat(rng, 8, soak.args.max_new_tokens)} for i in range(3)]
    text = "".join(json.dumps(line) + "\n" for line in lines)
    if rng.random() < 0.3:  # one line over the body cap: an error entry by its size, never parsed
        text += json.dumps({"custom_id": f"{name}-big", "body": {"pad": "x" * 2_100_000}}) + "\n"
    upload = soak.request(http, "POST", "/v1/files", data={"purpose": "batch"},
                          files={"file": (f"{name}.jsonl", text.encode())})
    if upload.status_code != 200:
        _expect_refusal(soak, "batch upload", upload)
        return
    reply = soak.request(http, "POST", "/v1/batches", json={"input_file_id": upload.json()["id"],
                                                            "endpoint": "/v1/chat/completions",
                                                            "completion_window": "24h"})
    if reply.status_code == 200:
        with soak.tally.lock:
            soak.tally.batches.append(reply.json()["id"])
    elif reply.status_code != 503:
        soak.tally.unexpected.append(f"batch create got {reply.status_code}: {reply.text[:120]}")


def do_file_flood(soak: Any, http: requests.Session, rng: random.Random, name: str) -> None:
    stored, refused = [], None
    for n in range(soak.args.flood_files):
        reply = soak.request(http, "POST", "/v1/files", data={"purpose": "batch"},
                             files={"file": (f"{name}-{n}.jsonl", b'{"custom_id": "x"}\n')})
        if reply.status_code != 200:
            refused = reply
            break
        stored.append(reply.json()["id"])
    if refused is not None:
        _expect_refusal(soak, "file flood", refused)
    for file_id in stored:
        gone = soak.request(http, "DELETE", f"/v1/files/{file_id}")
        if gone.status_code not in (200, 503):
            soak.tally.unexpected.append(f"file delete got {gone.status_code}: {gone.text[:120]}")


def _expect_refusal(soak: Any, what: str, reply: requests.Response) -> None:
    if not 400 <= reply.status_code < 500 and reply.status_code != 503:
        soak.tally.unexpected.append(f"{what} got {reply.status_code}: {reply.text[:120]}")


def batches_ended(base: str, batch_ids: list[str], timeout_s: float = 300) -> list[str]:
    """The batches still not in a terminal state after ``timeout_s`` (each read finalizes it
    once its jobs have ended)."""
    open_ids, deadline = list(batch_ids), time.monotonic() + timeout_s
    while open_ids and time.monotonic() < deadline:
        for batch_id in list(open_ids):
            try:
                status = requests.get(f"{base}/v1/batches/{batch_id}", timeout=30).json().get("status")
            except (requests.RequestException, ValueError):
                continue
            if status in BATCH_END:
                open_ids.remove(batch_id)
        if open_ids:
            time.sleep(2.0)
    return open_ids
