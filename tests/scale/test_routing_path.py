"""Cache-aware routing through the real stack: web, two Celery workers, Redis (tiny model).

Jobs sharing a long system prompt go to the worker that ran it first, hit its paged cache,
and the decisions show in /metrics and /workers. When that worker is SIGKILLed, jobs the
web had already routed to its own queue are moved back to the shared queue and finish on
the other worker."""
from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import pytest
import requests

from core.events import SUCCEEDED
from core.routing import ALIVE_S
from tests.harness.stack import wait_until
from tests.integration.conftest import started_workers_and_web, wait_terminal

pytestmark = pytest.mark.integration
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
SYSTEM = "You are the release manager. Check versions, changelogs and tags before you answer. " * 5


def body(i: int) -> dict:
    return {"system": SYSTEM, "prompt": f"question {i}", "max_new_tokens": 4, "generation_method": "paged"}


def run(base: str, store, i: int):
    reply = requests.post(f"{base}/jobs", json=body(i), timeout=15)
    assert reply.status_code == 202, reply.text
    return wait_terminal(store, reply.json()["id"], 60)


def test_routing_hits_then_survives_the_holder_dying(stack, store):
    last_cpu = max(os.sched_getaffinity(0))  # worker wa also shows MINISERVE_WORKER_CPUS at work
    specs = [{"name": "wa", "pool": "threads", "concurrency": 2, "MINISERVE_WORKER_CPUS": str(last_cpu)},
             {"name": "wb", "pool": "threads", "concurrency": 2}]
    # both workers load at once, the web boots meanwhile
    workers, web_proc, base = started_workers_and_web(stack, store, *specs, MINISERVE_ROUTE_MIN_PREFIX_TOKENS="32")
    try:
        first = run(base, store, 0)
        assert first.request["routing"]["decision"] == "not_cached" and first.request["routing"]["prefix_key"]
        later = [run(base, store, i) for i in range(1, 5)]
        for job in later:
            assert job.state == SUCCEEDED and job.request["routing"]["decision"] == "routed"
            assert job.worker == first.worker  # the holder ran it ...
            assert job.result["usage"]["cached_tokens"] >= first.request["routing"]["prefix_tokens"]  # ... from cache
        metrics = requests.get(f"{base}/metrics", timeout=10).text
        assert 'miniserve_routing_decisions_total{decision="routed"} 4.0' in metrics
        assert f'miniserve_worker_queue_depth{{worker="{first.worker}"}} 0.0' in metrics
        listed = requests.get(f"{base}/workers", timeout=10).json()["workers"]
        assert {w["info"]["queue"] for w in listed} == {"generation.wa@" + listed[0]["info"]["host"],
                                                       "generation.wb@" + listed[0]["info"]["host"]}

        check_monitor_page(base, first.worker)
        assert thread_cpus(workers[0].popen.pid) == {(last_cpu,)}  # every thread, after jobs ran
        assert thread_cpus(workers[1].popen.pid) == {tuple(sorted(os.sched_getaffinity(0)))}  # wb: not pinned

        holder = next(w for w in workers if first.worker.startswith(w.name.removeprefix("worker-") + "@"))
        holder.kill()
        killed_at = time.monotonic()
        routed = []
        for i in range(5, 8):  # the holder's heartbeat is still fresh: the web routes to its queue
            reply = requests.post(f"{base}/jobs", json=body(i), timeout=15).json()
            routed.append(reply["id"])
        assert all(store.get(j).request["routing"]["decision"] == "routed" for j in routed)
        for job_id in routed:
            record = wait_terminal(store, job_id, ALIVE_S + 30)
            assert record.state == SUCCEEDED and record.worker != first.worker
        assert time.monotonic() - killed_at < ALIVE_S + 30
        after = run(base, store, 9)  # the dead holder is no longer chosen
        assert after.request["routing"]["decision"] in ("routed", "not_cached", "holder_busy")
        assert after.worker != first.worker
    finally:  # teardown: no graceful stop is under test here
        for proc in (web_proc, *workers):
            proc.kill()


def thread_cpus(pid: int) -> set[tuple[int, ...]]:
    """The distinct CPU sets of a process's threads."""
    return {tuple(sorted(os.sched_getaffinity(int(tid)))) for tid in os.listdir(f"/proc/{pid}/task")}


def check_monitor_page(base: str, holder: str) -> None:
    """The cluster view: routing counts, the holder's row (host, routed here), a drawn chart."""
    if not Path(CHROMIUM).exists():
        return
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"])
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            page.set_default_timeout(20_000)
            page.goto(f"{base}/monitor")
            page.locator('#routing [data-decision="routed"] b', has_text="4").wait_for()
            row = page.locator("#workers tr.worker", has_text=holder)
            row.wait_for()
            cells = row.locator("td").all_inner_texts()
            assert cells[9] == "4"  # routed here
            assert "running" in cells[8] and "waiting" in cells[8]
            page.locator("#chart-now", has_text="tokens/s").wait_for()
            assert page.locator("#cluster-chart").evaluate("c => c.width > 0 && c.height > 0")
        finally:
            browser.close()
