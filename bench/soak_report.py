"""The soak's verdict (``python -m bench.soak``): what Redis and the worker logs say happened
to every accepted job, the summary, and the timeline plot."""
from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

from bench.stats import pyplot
from core.events import TERMINAL_EVENTS
from core.jobs import JobNotFound, JobStore

TERMINAL = set(TERMINAL_EVENTS)


def check_jobs(store: JobStore, tally) -> dict:
    """Every accepted job's end state, terminal events and attempts, as Redis has them."""
    states: Counter = Counter()
    lost, duplicated, reruns = [], [], 0
    for job_id in tally.accepted:
        try:
            record = store.get(job_id)
        except JobNotFound:
            lost.append(job_id)
            continue
        terminal = sum(e.type in TERMINAL for e in store.events(job_id))
        states[record.state] += 1
        reruns += record.attempt > 1
        if not record.is_terminal or terminal == 0 or tally.seen_terminal[job_id] == 0:
            lost.append(job_id)
        if terminal > 1 or tally.seen_terminal[job_id] > 1:
            duplicated.append(job_id)
    return {"states": dict(states), "lost": lost, "duplicated": duplicated, "re_run": reruns}


def attempt_intervals(logs: list[Path], killed_log: Path | None, killed_at: float | None,
                      end: float) -> dict[str, list[tuple[float, float, int]]]:
    """Per job: (start, end, attempt) of every attempt a worker log shows."""
    runs: dict[str, list[tuple[float, float, int]]] = {}
    for log in logs:
        open_runs: dict[tuple[str, int], float] = {}
        for line in log.read_text(errors="replace").splitlines():
            if '"job_started"' not in line and '"job_finished"' not in line:
                continue
            try:
                event = json.loads(line[line.index("{"):])
            except ValueError:
                continue
            key = (event.get("job_id"), int(event.get("attempt") or 0))
            if event.get("event") == "job_started":
                open_runs[key] = float(event["ts"])
            elif key in open_runs:
                runs.setdefault(key[0], []).append((open_runs.pop(key), float(event["ts"]), key[1]))
        stop = killed_at if (log == killed_log and killed_at) else end
        for (job_id, attempt), started in open_runs.items():
            runs.setdefault(job_id, []).append((started, stop, attempt))
    return runs


def concurrent_attempts(runs: dict[str, list[tuple[float, float, int]]]) -> list[str]:
    """Jobs with two attempts running at the same time."""
    overlapping = []
    for job_id, spans in runs.items():
        spans = sorted(spans)
        if any(later[0] < earlier[1] - 0.001 for earlier, later in zip(spans, spans[1:])):
            overlapping.append(job_id)
    return overlapping


def summarize(args, tally, jobs: dict, overlaps: list[str], seconds: float,
              faults_done: list[tuple[float, str]]) -> dict:
    classes = Counter(f"{code // 100}xx" for code in tally.statuses.elements())
    times = dict((what, t) for t, what in faults_done)
    down, up = times.get("redis_down", float("inf")), times.get("redis_up", float("inf")) + 5.0
    outside = sum(1 for t, what in tally.timeline if what.startswith("http_5") and not down <= t <= up)
    return {
        "minutes": args.minutes, "clients": args.clients, "hostile_share": args.hostile,
        "lease_s": args.lease_s, "outage_s": args.outage_s, "workers": args.workers,
        "concurrency": args.concurrency, "seconds": round(seconds, 1),
        "requests_by_kind": dict(tally.by_kind), "accepted_jobs": len(tally.accepted),
        "job_states": jobs["states"], "lost": len(jobs["lost"]), "duplicated_terminal_events": len(jobs["duplicated"]),
        "batches_started": len(tally.batches), "batches_not_ended": len(jobs.get("open_batches", ())),
        "repeated_sse_seqs": tally.repeated_seqs, "re_run": jobs["re_run"],
        "concurrent_attempts": len(overlaps), "responses": dict(sorted(tally.statuses.items())),
        "responses_by_class": dict(classes), "http_500": sum(n for c, n in tally.statuses.items() if c >= 500 and c != 503),
        "http_503": tally.statuses.get(503, 0), "http_5xx_outside_outage": outside, "unexpected": tally.unexpected[:20],
        "client_errors": dict(tally.client_errors), "faults": faults_done,
        "examples": {"lost": jobs["lost"][:5], "duplicated": jobs["duplicated"][:5], "concurrent": overlaps[:5]},
    }


def plot(tally, summary: dict, ends: list[float], path: Path) -> Path:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(10, 4))
    span = max([*ends, 1.0])
    buckets = [0] * (int(span // 5) + 1)
    for t in ends:
        buckets[int(t // 5)] += 1
    ax.plot([i * 5 for i in range(len(buckets))], [b / 5 for b in buckets], label="jobs ended / s")
    for t, what in summary["faults"]:
        ax.axvline(t, color="red" if what in ("kill", "redis_down") else "green", ls="--", lw=1)
        ax.text(t, ax.get_ylim()[1] * 0.9, what, rotation=90, fontsize=7, va="top")
    fives = [t for t, what in tally.timeline if what.startswith("http_5")]
    if fives:
        ax.plot(fives, [0] * len(fives), "|", color="orange", label="5xx answers (503 while Redis is down)")
    ax.set_xlabel("seconds since start")
    ax.set_title(f"soak: {summary['accepted_jobs']} jobs, lost {summary['lost']}, duplicated "
                 f"{summary['duplicated_terminal_events']}, concurrent attempts {summary['concurrent_attempts']}, "
                 f"500s {summary['http_500']}")
    ax.legend(fontsize=8, loc="lower left")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
