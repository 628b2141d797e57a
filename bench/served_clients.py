"""The served benchmarks' clients, shared by ``bench.queue_served`` (our ``/v1`` and the
in-process engine) and ``bench.llama_served`` (llama.cpp's server): the chats they send,
how n clients run them, and the outcome one request had."""
from __future__ import annotations

import concurrent.futures as futures
import json
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import requests

from bench.stats import p50

TOPICS = ["a KV cache", "paged attention", "continuous batching", "rotary position embeddings",
          "grouped-query attention", "the softmax function", "a hash table", "gradient descent",
          "a Bloom filter", "TCP slow start", "a B-tree", "the CAP theorem", "garbage collection",
          "a mutex", "Python's GIL", "copy-on-write", "a Merkle tree", "backpropagation",
          "dropout", "beam search", "a red-black tree", "TLS handshakes", "a ring buffer", "SIMD",
          "a trie", "Raft consensus", "an LSM tree", "a page table", "a skip list", "UTF-8",
          "a semaphore", "quicksort"]


@dataclass
class Outcome:
    """One request as its client saw it."""
    ttft_s: float
    tokens: int


def prompt(client: int, round_: int) -> str:
    return f"Explain {TOPICS[(client * 3 + round_) % len(TOPICS)]} in detail, step by step."


def run_clients(n: int, rounds: int, one: Callable[[int, int], Outcome]) -> dict[str, Any]:
    """``n`` clients at once, each ``rounds`` requests in a row; aggregate tokens/s and TTFTs."""
    def client(c: int) -> list[Outcome]:
        return [one(c, r) for r in range(rounds)]

    started = time.perf_counter()
    with futures.ThreadPoolExecutor(n) as pool:
        outcomes = [o for part in pool.map(client, range(n)) for o in part]
    wall = time.perf_counter() - started
    tokens = sum(o.tokens for o in outcomes)
    return {"wall_s": wall, "tokens": tokens, "tok_per_s": tokens / wall,
            "ttft_p50_s": p50([o.ttft_s for o in outcomes])}


def median_throughput(n: int, one: Callable[[int, int], Outcome], rounds: int = 3) -> dict[str, Any]:
    """``n`` clients at once, a warm round then ``rounds`` measured ones: ``b<n>_tps`` is the median
    round's tokens/s (each round is kept in ``b<n>_rounds``). One round of a few seconds samples
    the shared host's load as much as the server, so each side of a comparison takes the same median."""
    run_clients(n, 1, one)  # warm: the slots' or the paged pool's buffers, the batched kernels
    measured = [run_clients(n, 1, one) for _ in range(rounds)]
    tps = [round(m["tok_per_s"], 2) for m in measured]
    return {f"b{n}_tps": sorted(tps)[len(tps) // 2], f"b{n}_rounds": tps, f"b{n}_tokens": measured[0]["tokens"]}


def chat_body(model: str, client: int, round_: int, new_tokens: int) -> dict[str, Any]:
    return {"model": model, "messages": [{"role": "user", "content": prompt(client, round_)}],
            "max_tokens": new_tokens, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}}


def openai_client(base_url: str, model: str, new_tokens: int, extra: dict[str, Any] | None = None
                  ) -> Callable[[int, int], Outcome]:
    """A streaming OpenAI chat client (ours or llama-server's), a fresh connection per request.

    Not a kept-alive session: llama-server closes a reused connection between a client's rounds
    (``RemoteDisconnected``), and both servers must be asked the same way; a local TCP connect
    costs well under a millisecond beside a chat's tenths of a second."""
    def one(client: int, round_: int) -> Outcome:
        body = {**chat_body(model, client, round_, new_tokens), **(extra or {})}
        started = time.perf_counter()
        ttft, tokens, pieces = float("nan"), 0, 0
        with requests.post(f"{base_url}/v1/chat/completions", json=body, stream=True, timeout=600,
                           headers={"Connection": "close"}) as response:
            if response.status_code != 200:  # say which server refused what, not only the status
                raise RuntimeError(f"{base_url} answered {response.status_code}: {response.text[:300]}")
            for raw in response.iter_lines(delimiter=b"\n"):  # not splitlines(): U+2028 in a token is text
                line = raw.decode("utf-8").rstrip("\r")
                if not line or not line.startswith("data:") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[5:])
                if "error" in chunk:
                    raise RuntimeError(f"stream error: {chunk['error']}")
                delta = (chunk.get("choices") or [{}])[0].get("delta") or {}
                if delta.get("content"):
                    pieces += 1
                    if ttft != ttft:
                        ttft = time.perf_counter() - started
                if chunk.get("usage"):
                    tokens = int(chunk["usage"]["completion_tokens"])
        return Outcome(ttft, tokens or pieces)  # a server without usage: one piece per token (llama-server)
    return one


@dataclass
class Mode:
    """One path: how to run n clients, and the processes whose CPU it costs."""
    name: str
    run: Callable[[int], dict[str, Any]]
    processes: dict[str, int] = field(default_factory=dict)  # label -> root pid
    prepare: Callable[[int], None] | None = None  # made ready for n clients before it is timed
