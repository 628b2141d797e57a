"""Fair share between API keys, and how well a queued job's estimated start holds. Run as a
mode of the queue benchmark::

    python -m bench queue_overhead --fair-share [--flood 300] [--guests 10] [--max-new-tokens 8]

For each setting (the fair gate with its defaults; no gate, ``MINISERVE_QUEUE_WINDOW=0``:
plain FIFO) a fresh stack (redis-server, one 8-slot worker, the web, keys ``key-a`` and
``key-b``) first runs key B's ``--guests`` jobs alone, then key A submits ``--flood`` jobs at
once and key B its ``--guests`` right after. Reported: B's p50 latency (accepted to ended)
beside the flood against alone (the target: at most 2x with the gate), that every A job
ended, and for queued jobs (every tenth of A's, all of B's) the error of the
``estimated_start`` that ``GET /jobs/{id}`` gave right after submission against the real
start, as a share of the real wait. Writes results/fair_share.json.
"""
from __future__ import annotations

import concurrent.futures as futures
import statistics
import time
from pathlib import Path
from typing import Any, Callable

import requests

from bench.stats import machine_info, write_json
from tests.harness.stack import wait_until

KEYS = {"key-a": {"Authorization": "Bearer key-a"}, "key-b": {"Authorization": "Bearer key-b"}}
SETTINGS = (2, 0)  # MINISERVE_QUEUE_WINDOW: the gate's default, then off
MAX_RATIO = 2.0


def _submit(base: str, key: str, max_tokens: int, n: int) -> tuple[str, dict[str, Any]]:
    body = {"prompt": f"Job {n}: name a colour.", "max_new_tokens": max_tokens}
    reply = requests.post(f"{base}/jobs", json=body, headers=KEYS[key], timeout=60)
    reply.raise_for_status()
    return reply.json()["id"], {"submitted": time.time()}


def _view(base: str, key: str, job_id: str) -> dict[str, Any]:
    return requests.get(f"{base}/jobs/{job_id}", headers=KEYS[key], timeout=60).json()


def _with_estimate(base: str, key: str, job_id: str, mark: dict[str, Any]) -> dict[str, Any]:
    view = _view(base, key, job_id)
    return {**mark, "estimated_start": view.get("estimated_start"), "position": view.get("queue_position")}


def _wait_ended(base: str, key: str, ids: list[str], timeout_s: float = 1800) -> dict[str, dict[str, Any]]:
    ended: dict[str, dict[str, Any]] = {}

    def done() -> bool:
        for job_id in [j for j in ids if j not in ended]:
            view = _view(base, key, job_id)
            if view["state"] not in ("queued", "running"):
                ended[job_id] = view
        return len(ended) == len(ids)

    wait_until(done, timeout_s, interval_s=1.0, what=f"{len(ids)} jobs of {key}")
    return ended


def _latencies(views: dict[str, dict[str, Any]]) -> list[float]:
    return [v["finished_at"] - v["created_at"] for v in views.values()]


def _estimate_errors(marks: dict[str, dict[str, Any]], views: dict[str, dict[str, Any]]) -> list[float]:
    """|estimated - real start| / real wait, for jobs that got an estimate and waited."""
    errors = []
    for job_id, mark in marks.items():
        start, estimate = views[job_id].get("started_at"), mark.get("estimated_start")
        wait = (start or 0) - mark["submitted"]
        if start and estimate and wait > 1.0:
            errors.append(abs(estimate - start) / wait)
    return errors


def one_setting(base: str, window: int, reserved: int, flood: int, guests: int, max_tokens: int) -> dict[str, Any]:
    _wait_ended(base, "key-b", [_submit(base, "key-b", max_tokens, -1)[0]])  # warmup
    alone = _wait_ended(base, "key-b", [_submit(base, "key-b", max_tokens, n)[0] for n in range(guests)])
    with futures.ThreadPoolExecutor(8) as pool:
        a_jobs = list(pool.map(lambda n: _submit(base, "key-a", max_tokens, n), range(flood)))
    b_marks = dict(_submit(base, "key-b", max_tokens, n) for n in range(guests))
    b_marks = {j: _with_estimate(base, "key-b", j, m) for j, m in b_marks.items()}
    a_marks = {j: _with_estimate(base, "key-a", j, m) for j, m in a_jobs[::10]}
    beside = _wait_ended(base, "key-b", list(b_marks))
    a_views = _wait_ended(base, "key-a", [j for j, _ in a_jobs])
    ratio = statistics.median(_latencies(beside)) / statistics.median(_latencies(alone))
    errors = _estimate_errors(a_marks, a_views) + _estimate_errors(b_marks, beside)
    return {"queue_window": window, "reserved_slots": reserved, "flood_jobs": flood, "guest_jobs": guests,
            "b_alone_p50_s": round(statistics.median(_latencies(alone)), 2),
            "b_beside_flood_p50_s": round(statistics.median(_latencies(beside)), 2), "ratio": round(ratio, 2),
            "a_jobs_succeeded": sum(v["state"] == "succeeded" for v in a_views.values()),
            "estimates": len(errors), "estimate_error_p50": round(statistics.median(errors), 3) if errors else None,
            "estimate_error_p90": round(sorted(errors)[int(0.9 * (len(errors) - 1))], 3) if errors else None}


def compare(stack_for: Callable[[int, int], Any], flood: int, guests: int, max_tokens: int,
            output: Path) -> list[dict[str, Any]]:
    """``stack_for(window, reserved)``: a context manager yielding a ready stack's base URL."""
    rows = []
    for window in SETTINGS:
        reserved = 1 if window else 0
        with stack_for(window, reserved) as base:
            rows.append(one_setting(base, window, reserved, flood, guests, max_tokens))
        print(rows[-1], flush=True)
    write_json(output, {"max_tokens": max_tokens, "target_ratio": MAX_RATIO, "machine": machine_info(),
                        "command": f"python -m bench queue_overhead --fair-share --flood {flood} --guests {guests} "
                                   f"--max-new-tokens {max_tokens}", "rows": rows})
    return rows
