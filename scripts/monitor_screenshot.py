"""The README's monitor screenshot, taken on a real local stack with the default model:
a Chinese and an English generation, a prefix-cache hit, an agent job, then the page with
the agent job's detail open, in Debian's headless Chromium.

    python -m scripts.monitor_screenshot [--output results/monitor.png]
"""
from __future__ import annotations

import argparse
import shutil
from pathlib import Path

import requests

from core.events import TERMINAL_STATES
from core.workers import list_workers
from tests.harness.stack import Stack, start_redis, job_store, wait_until

CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]
JOBS = [
    {"prompt": "请用两句话解释什么是 KV Cache。", "max_new_tokens": 48, "generation_method": "paged"},
    {"prompt": "Explain rotary position embeddings in one sentence.", "max_new_tokens": 40,
     "generation_method": "custom_cache"},
    {"prefix": "You are a concise teaching assistant.", "prompt": "What is grouped-query attention?",
     "max_new_tokens": 24, "generation_method": "prefix_cache"},
    {"prefix": "You are a concise teaching assistant.", "prompt": "What is top-p sampling?",
     "max_new_tokens": 24, "generation_method": "prefix_cache"},
    {"type": "agent", "prompt": "请计算 (125 * 8) - 37，并说明结果。", "max_steps": 3, "max_new_tokens": 96},
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output", default="results/monitor.png")
    args = parser.parse_args()
    redis_proc, url = start_redis(Path("/tmp"))
    stack = Stack(redis_url=url, env_overrides={"MINISERVE_MODEL": "default", "MINISERVE_LOG_LEVEL": "WARNING"})
    worker = stack.start_worker(pool="threads", concurrency=8)
    web, base = stack.start_web()
    store = job_store(url)
    try:
        wait_until(lambda: any(w["info"].get("engine_loaded") for w in list_workers(store.client, 15)), 300,
                   what="worker")
        ids = [requests.post(f"{base}/jobs", json=body, timeout=30).json()["id"] for body in JOBS]
        wait_until(lambda: all(store.get(i).state in TERMINAL_STATES for i in ids), 600, interval_s=1, what="jobs")
        shoot(f"{base}/monitor#job={ids[-1]}", Path(args.output))
    finally:
        for proc in (web, worker, redis_proc):
            proc.stop()
    print(f"wrote {args.output}")


def shoot(url: str, path: Path) -> None:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=shutil.which("chromium") or "/usr/bin/chromium",
                                    args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        page.goto(url)
        page.locator("#trace-box:not([hidden])").wait_for(timeout=30_000)
        page.wait_for_timeout(6000)  # one more heartbeat: the worker's cache statistics
        path.parent.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(path), full_page=True)
        browser.close()


if __name__ == "__main__":
    main()
