"""What ``POST /v1/batches`` costs the web: its answer time, how long the intake then takes to
read every line, and each web process's resident memory growth, for a 50,000-line file and
a single ~20 MB line. Run as a mode of the queue benchmark::

    python -m bench queue_overhead --batch-create [--create-lines 50000] [--model default]

Starts a redis-server and the web (``MINISERVE_WEB_WORKERS`` gunicorn processes, queue depth
unbounded so every line becomes a job); no worker: the jobs stay queued, which is what the
web's side of a batch costs. Each web process's ``VmRSS`` is read from ``/proc`` before the
POST and every 50 ms until the batch leaves ``validating``; growth is the peak minus the
reading before. Writes results/batch_create.json.
"""
from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import requests

from bench.soak_memory import vm_rss_mb
from bench.stats import machine_info, write_json
from tests.harness.stack import Stack, start_redis, wait_until

SAMPLE_S = 0.05


def many_lines(count: int) -> bytes:
    return "".join(json.dumps({"custom_id": f"r{i}", "method": "POST", "url": "/v1/chat/completions",
                               "body": {"messages": [{"role": "user", "content": f"Question {i}: name a river."}],
                                        "max_tokens": 8}}) + "\n" for i in range(count)).encode()


def one_huge_line(size: int) -> bytes:
    head = '{"custom_id": "huge", "method": "POST", "url": "/v1/chat/completions", "body": {"messages": ' \
           '[{"role": "user", "content": "'
    tail = '"}], "max_tokens": 8}}\n'
    return (head + "word " * ((size - len(head) - len(tail)) // 5) + tail).encode()


def web_pids(master: int) -> list[int]:
    """The gunicorn worker processes under the web's master."""
    children = Path(f"/proc/{master}/task/{master}/children").read_text().split()
    return sorted(int(pid) for pid in children)


class RssPeaks:
    """Each process's largest ``VmRSS`` while it runs (a sampling thread)."""

    def __init__(self, pids: list[int]) -> None:
        self.before = {pid: vm_rss_mb(pid) for pid in pids}
        self.peak = dict(self.before)
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._sample, daemon=True)
        self.thread.start()

    def _sample(self) -> None:
        while not self.done.wait(SAMPLE_S):
            for pid in self.peak:
                self.peak[pid] = max(self.peak[pid], vm_rss_mb(pid))

    def stop(self) -> list[dict[str, float]]:
        self.done.set()
        self.thread.join()
        return [{"pid": pid, "rss_before_mb": round(self.before[pid], 1), "rss_peak_mb": round(self.peak[pid], 1),
                 "growth_mb": round(self.peak[pid] - self.before[pid], 1)} for pid in sorted(self.peak)]


def one_case(base_url: str, master: int, name: str, data: bytes) -> dict[str, Any]:
    file_id = requests.post(f"{base_url}/v1/files", data={"purpose": "batch"},
                            files={"file": (f"{name}.jsonl", data)}, timeout=300).json()["id"]
    time.sleep(1)  # the upload's garbage settles before the reading "before"
    peaks = RssPeaks(web_pids(master))
    started = time.perf_counter()
    answer = requests.post(f"{base_url}/v1/batches", json={"input_file_id": file_id, "completion_window": "24h",
                                                           "endpoint": "/v1/chat/completions"}, timeout=600)
    post_s = time.perf_counter() - started
    state: dict[str, Any] = {}

    def read() -> bool:
        state.update(requests.get(f"{base_url}/v1/batches/{answer.json()['id']}", timeout=600).json())
        return state["status"] != "validating"

    wait_until(read, 3600, interval_s=0.2, what="the batch's intake")
    intake_s = time.perf_counter() - started
    processes = peaks.stop()
    result = {"case": name, "file_bytes": len(data), "post_status": answer.json()["status"],
              "post_seconds": round(post_s, 3), "intake_seconds": round(intake_s, 2), "status": state["status"],
              "request_counts": state["request_counts"], "processes": processes,
              "max_growth_mb": max(p["growth_mb"] for p in processes)}
    print(json.dumps(result))
    return result


def run(model: str, lines: int, output: Path) -> dict[str, Any]:
    env = {"MINISERVE_MODEL": model, "MINISERVE_JSON_LOGS": "true", "MINISERVE_LOG_LEVEL": "WARNING",
           "MINISERVE_MAX_QUEUE_DEPTH": "0", "MINISERVE_RATE_LIMIT_PER_MINUTE": "0"}
    redis_proc, url = start_redis(Path("/tmp"))
    stack = Stack(redis_url=url, env_overrides=env)
    web, base_url = stack.start_web()
    try:
        wait_until(lambda: _answers(base_url), 60, what="the web")
        cases = [one_case(base_url, web.popen.pid, f"{lines}_lines", many_lines(lines)),
                 one_case(base_url, web.popen.pid, "one_20mb_line", one_huge_line(19_900_000))]
    finally:
        for proc in (web, redis_proc):
            proc.stop()
    result = {"model": model, "lines": lines, "web_workers": len(cases[0]["processes"]), "cases": cases,
              "machine": machine_info()}
    write_json(output, result)
    return result


def _answers(base_url: str) -> bool:
    try:
        return requests.get(f"{base_url}/healthz", timeout=2).status_code < 500
    except requests.RequestException:
        return False
