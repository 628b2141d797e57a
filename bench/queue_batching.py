"""Run batches of jobs through the real queue: web -> Redis -> one Celery worker process
(threads pool feeding the paged scheduler) -> Redis -> SSE, for ``bench.batching``.

The runner starts its own redis-server, worker and web server, and submits N jobs at once
from N client threads, each following its job's stream; time to first token is what each
client saw, from its POST to its first token event.
"""
from __future__ import annotations

import concurrent.futures as futures
import time
from pathlib import Path

import requests

from core.workers import list_workers
from tests.harness.client import submit_and_follow
from tests.harness.stack import Stack, start_redis, job_store, wait_until


class QueueBatchRunner:
    """Context manager: a local stack whose worker accepts ``max_batch`` jobs at once."""

    def __init__(self, model: str = "default", max_batch: int = 16, threads: int = 2, quant: str = "auto",
                 repetition_penalty: float = 1.0):
        self.env = {"MINISERVE_MODEL": model, "MINISERVE_THREADS": str(threads),
                    "MINISERVE_MAX_BATCH": str(max_batch),
                    "MINISERVE_MAX_BATCHED_TOKENS": str(max(512, 64 * max_batch)),
                    "MINISERVE_LOG_LEVEL": "WARNING", "MINISERVE_QUANT": quant}
        self.max_batch = max_batch
        self.repetition_penalty = repetition_penalty  # the caller's, so every mode samples alike

    def __enter__(self) -> "QueueBatchRunner":
        self.redis_proc, url = start_redis(Path("/tmp"))
        stack = Stack(redis_url=url, env_overrides=self.env)
        self.worker = stack.start_worker(pool="threads", concurrency=self.max_batch)
        self.web, self.base_url = stack.start_web()
        store = job_store(url)
        self.store = store
        wait_until(lambda: any(w["info"].get("engine_loaded") for w in list_workers(store.client, 15)),
                   300, what="worker with a loaded model")
        wait_until(self._web_up, 30, what="web server")
        return self

    def __exit__(self, *exc: object) -> None:
        for proc in (self.web, self.worker, self.redis_proc):
            proc.stop()

    def _web_up(self) -> bool:
        try:
            return requests.get(f"{self.base_url}/healthz", timeout=2).status_code == 200
        except requests.RequestException:
            return False

    def run(self, texts: list[str], new_tokens: int) -> dict:
        """All jobs at once; returns wall time, generated tokens and client-seen TTFTs."""
        def one(text: str):
            trace = submit_and_follow(self.base_url, {"prompt": text, "max_new_tokens": new_tokens,
                                                      "generation_method": "paged",
                                                      "repetition_penalty": self.repetition_penalty})
            return trace, self.store.get(trace.job_id).result

        start = time.perf_counter()
        with futures.ThreadPoolExecutor(len(texts)) as pool:
            outcomes = list(pool.map(one, texts))
        wall = time.perf_counter() - start
        tokens = [result["usage"]["completion_tokens"] for _, result in outcomes]
        ttfts = [trace.first_token_s for trace, _ in outcomes]
        return {"wall_s": wall, "tokens": tokens, "ttfts": ttfts,
                "texts": [result["text"] for _, result in outcomes]}
