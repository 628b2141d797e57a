"""The README's screenshots of every view, taken on a real local stack (redis-server, a Celery
worker with the default model, the web) in Debian's headless Chromium: the playground's
chat, an agent run, the compare view after "same prefix again", the KV pool while two jobs
with one prefix run, and the monitor page with the agent job open.

    .venv/bin/python -m scripts.screenshots [--out docs/img] [--model default]
    .venv/bin/python -m scripts.screenshots --base http://127.0.0.1:8000 --only worker,monitor

``--base`` shoots a service already running (its model, its jobs) instead of starting one;
``--only`` takes some views (the monitor opens the newest agent job).
"""
from __future__ import annotations

import argparse
import shutil
import time
from pathlib import Path
from typing import Callable

import requests
from playwright.sync_api import TimeoutError as PlaywrightTimeout

from bench.local_stack import serving_stack

CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]
VIEWPORT = {"width": 1300, "height": 860}
LONG_S = 600_000  # ms: the default model on a busy CPU is slow; a view waits up to 10 minutes
COUNTING = "([0-9]+\\n){300}"  # three hundred numbered lines: a job that outlives a few heartbeats
POOL_PREFIX = ("You are a patient teacher of computer science. Answer with care, in plain words, "
               "and give one small example.")


def chat(page, base: str) -> None:
    page.goto(base)
    page.fill("#max_new_tokens", "48")
    # English only: Debian's headless chromium has no CJK font here (Chinese shows as boxes)
    for text in ("What is a KV cache, in two sentences?", "And what does a prefix cache add?"):
        count = page.locator("#conversation .turn.assistant[data-state]").count()
        page.fill("#prompt", text)
        page.press("#prompt", "Enter")
        page.locator("#conversation .turn.assistant[data-state]").nth(count).wait_for(timeout=LONG_S)


def agent(page, base: str) -> None:
    page.goto(base)
    page.check("#agent-mode")
    page.fill("#max_new_tokens", "96")
    page.fill("#prompt", "What is (125 * 8) - 37?")
    page.press("#prompt", "Enter")
    page.locator("#conversation .turn.agent[data-state]").wait_for(timeout=LONG_S)


def compare(page, base: str) -> None:
    page.goto(base)
    page.click("#tab-compare")
    page.fill("#max_new_tokens", "24")
    for button in ("#compare-run", "#compare-again"):
        page.click(button)
        page.locator("#compare-again:not([disabled])").wait_for(timeout=LONG_S)


def worker(page, base: str) -> list[str]:
    """Two long paged jobs with one prefix, the second sent once the first has prefilled: it
    reuses the first one's committed prefix blocks, so the view shows them shared. Returns
    their ids."""
    def submit(prompt: str) -> str:
        return requests.post(f"{base}/jobs", timeout=30, json={
            "prefix": POOL_PREFIX, "prompt": prompt, "max_new_tokens": 2000, "generation_method": "paged",
            "guided_regex": COUNTING}).json()["id"]

    # answers that run long: left free, the model ends a count after a few lines with its end token
    ids = [submit("Count from 1 to 400, one number per line.")]
    page.goto(base)
    page.click("#tab-worker")
    summary = "document.getElementById('pool-summary').textContent"
    page.wait_for_function(f"/in use [1-9]/.test({summary})", timeout=LONG_S)
    ids.append(submit("Count from 400 down to 1, one number per line."))
    try:
        page.wait_for_function(f"/shared [1-9]/.test({summary})", timeout=30_000)
    except PlaywrightTimeout:
        print("no shared blocks seen: the view shows the blocks in use")
    return ids


def monitor(page, base: str, agent_job: str) -> None:
    page.goto(f"{base}/monitor#job={agent_job}")
    page.locator("#trace-box:not([hidden])").wait_for(timeout=LONG_S)
    page.wait_for_timeout(12_000)  # a few polls: the charts draw a line, not a dot


def shoot(page, path: Path, action: Callable[[], object], full_page: bool = False) -> object:
    started = time.perf_counter()
    out = action()
    page.screenshot(path=str(path), full_page=full_page)
    print(f"{path} ({time.perf_counter() - started:.0f} s)")
    return out


VIEWS = ("chat", "agent", "compare", "worker", "monitor")


def newest_agent_job(base: str) -> str:
    return requests.get(f"{base}/overview?type=agent&limit=1", timeout=30).json()["jobs"][0]["id"]


def take_all(base: str, out: Path, views: tuple[str, ...] = VIEWS) -> None:
    from playwright.sync_api import sync_playwright

    out.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=shutil.which("chromium") or "/usr/bin/chromium",
                                    args=CHROMIUM_ARGS)
        page = browser.new_page(viewport=VIEWPORT)
        if "chat" in views:
            shoot(page, out / "chat.png", lambda: chat(page, base))
        if "agent" in views:
            shoot(page, out / "agent.png", lambda: agent(page, base))
        if "compare" in views:
            shoot(page, out / "compare.png", lambda: compare(page, base), full_page=True)
        if "worker" in views:
            for job_id in shoot(page, out / "worker.png", lambda: worker(page, base)):
                requests.post(f"{base}/jobs/{job_id}/cancel", timeout=30)
        if "monitor" in views:
            shoot(page, out / "monitor.png", lambda: monitor(page, base, newest_agent_job(base)), full_page=True)
        browser.close()


def answers(base: str) -> bool:
    try:
        return requests.get(f"{base}/healthz", timeout=2).status_code == 200
    except requests.RequestException:
        return False


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="docs/img", help="folder for the PNGs")
    parser.add_argument("--model", default="default", help="MINISERVE_MODEL for the worker and the web")
    parser.add_argument("--base", help="the URL of a running service to shoot (no stack is started)")
    parser.add_argument("--only", default=",".join(VIEWS), help=f"comma-separated views of {', '.join(VIEWS)}")
    args = parser.parse_args()
    views = tuple(v for v in args.only.split(",") if v)
    if unknown := set(views) - set(VIEWS):
        parser.error(f"--only: no view {', '.join(sorted(unknown))}")
    if args.base:
        take_all(args.base.rstrip("/"), Path(args.out), views)
        return
    with serving_stack({"MINISERVE_MODEL": args.model, "MINISERVE_LOG_LEVEL": "WARNING"}, up=answers) as base:
        take_all(base, Path(args.out), views)


if __name__ == "__main__":
    main()
