"""What the benchmarks that start a local stack share (``bench.load``, its connections mode,
``bench.scale``, ``bench.soak``, ``bench.queue_overhead --priorities``, scripts/screenshots.py):
the tiny model they serve when none is named, whether the web answers yet, and a whole
serving stack of its own."""
from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Callable, Iterator

import requests


def tiny_model(folder: Path) -> str:
    from tests.tiny_model import make_tiny_model_dir

    return str(make_tiny_model_dir(folder, hidden_size=64, num_layers=2))


def web_is_up(base_url: str) -> bool:
    try:
        return requests.get(f"{base_url}/healthz", timeout=2).status_code == 200
    except requests.RequestException:
        return False


@contextlib.contextmanager
def serving_stack(env: dict[str, str], up: Callable[[str], bool] = web_is_up,
                  load_s: float = 600) -> Iterator[str]:
    """A redis-server of its own, one worker of the production pool (threads, 8 slots) and
    the web, with ``env``; yields the web's base URL once the model is loaded and ``up``
    says the web answers, and stops all three after."""
    from core.workers import list_workers
    from tests.harness.stack import Stack, job_store, start_redis, wait_until

    redis_proc, url = start_redis(Path("/tmp"))
    stack = Stack(redis_url=url, env_overrides=env)
    worker = stack.start_worker(pool="threads", concurrency=8)
    web, base_url = stack.start_web()
    store = job_store(url)
    try:
        wait_until(lambda: any(w["info"].get("engine_loaded") for w in list_workers(store.client, 15)), load_s,
                   what="the worker to load its model")
        wait_until(lambda: up(base_url), 60, what="the web")
        yield base_url
    finally:
        for proc in (web, worker, redis_proc):
            proc.stop()
