"""Job totals for ``/metrics``, kept in Redis and brought up to date at scrape time (the web
calls :func:`fold` and :func:`read_totals`; every Redis access stays here, in ``core``).

Why not counters in the web process: gunicorn runs several processes, each would count
only the requests it saw, and the web never sees a job end anyway (the worker does). Why
not count in the worker: the totals would then depend on every code path that ends a job
(worker, reaper, cancel of a queued job). Instead each scrape *folds* finished jobs into
one Redis hash (:data:`core.keys.METRICS_TOTALS`): it scans the newest
:data:`FOLD_WINDOW` jobs, claims each finished one exactly once (a Lua ``HSETNX`` of a
field on the job's own hash, so two scrapes in two processes never count a job twice),
and adds its counts and histogram observations. The totals only grow, so they are true
Prometheus counters, shared by every web process and surviving restarts. A job that ends
after more than :data:`FOLD_WINDOW` newer jobs were created is not counted.
"""
from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass
from typing import Any

import redis

from core import keys, scripts
from core.events import TERMINAL_STATES

FOLD_WINDOW = 2000
TTFT_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
LATENCY_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0)
HISTOGRAMS = {"ttft": TTFT_BUCKETS, "latency": LATENCY_BUCKETS}


@dataclass
class WindowState:
    """What one scan saw: jobs not yet ended, by state (a gauge, not a total)."""

    active: Counter


def _bucket(value: float, buckets: tuple[float, ...]) -> str:
    return next((repr(b) for b in buckets if value <= b), "+Inf")


def observations(job: dict[str, str]) -> Counter:
    """The increments one finished job adds to the totals."""
    out: Counter = Counter()
    job_type, state = job.get("type", "?"), job.get("state", "?")
    out[f"jobs|{job_type}|{state}"] += 1
    result = _json(job.get("result")) or _json(job.get("error")) or {}
    if "partial" in result and isinstance(result["partial"], dict):
        result = result["partial"]
    usage = result.get("usage") or {}
    for name in ("completion_tokens", "prompt_tokens", "cached_tokens", "draft_tokens", "accepted_draft_tokens"):
        out[f"tokens|{job_type}|{name}"] += int(usage.get(name) or 0)
    ttft = (result.get("timings") or {}).get("ttft_s")
    if ttft:
        _observe(out, "ttft", job_type, float(ttft))
    if job.get("finished_at") and job.get("created_at"):
        _observe(out, "latency", job_type, max(0.0, float(job["finished_at"]) - float(job["created_at"])))
    return out


def _observe(out: Counter, family: str, job_type: str, value: float) -> None:
    out[f"{family}|{job_type}|{_bucket(value, HISTOGRAMS[family])}"] += 1
    out[f"{family}|{job_type}|sum"] += value
    out[f"{family}|{job_type}|count"] += 1


def _json(text: str | None) -> dict[str, Any] | None:
    try:
        value = json.loads(text) if text else None
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def fold(client: redis.Redis, window: int = FOLD_WINDOW) -> WindowState:
    """Add every newly finished job in the window to the totals; returns what was active."""
    ids = client.zrevrange(keys.JOBS_INDEX, 0, window - 1)
    pipe = client.pipeline(transaction=False)
    for job_id in ids:
        pipe.hmget(keys.job_key(job_id), "state", keys.METRICS_COUNTED_FIELD)
    active: Counter = Counter()
    candidates = []
    for job_id, (state, counted) in zip(ids, pipe.execute()):
        if state in TERMINAL_STATES and not counted:
            candidates.append(job_id)
        elif state and state not in TERMINAL_STATES:
            active[state] += 1
    totals = _claim_and_count(client, candidates)
    if totals:
        pipe = client.pipeline(transaction=True)
        for field_name, value in totals.items():
            if isinstance(value, float) and not value.is_integer():
                pipe.hincrbyfloat(keys.METRICS_TOTALS, field_name, value)
            else:
                pipe.hincrby(keys.METRICS_TOTALS, field_name, int(value))
        pipe.execute()
    return WindowState(active)


def _claim_and_count(client: redis.Redis, candidates: list[str]) -> Counter:
    claim = client.register_script(scripts.CLAIM_FOR_METRICS)
    pipe = client.pipeline(transaction=False)
    for job_id in candidates:
        claim(keys=[keys.job_key(job_id)], args=[keys.METRICS_COUNTED_FIELD], client=pipe)
    claimed = [job_id for job_id, won in zip(candidates, pipe.execute()) if int(won)]
    pipe = client.pipeline(transaction=False)
    for job_id in claimed:
        pipe.hgetall(keys.job_key(job_id))
    totals: Counter = Counter()
    for raw in pipe.execute():
        if raw:
            totals.update(observations(raw))
    return totals


def read_totals(client: redis.Redis) -> dict[str, float]:
    return {k: float(v) for k, v in client.hgetall(keys.METRICS_TOTALS).items()}
