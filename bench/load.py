"""Load: N concurrent clients each submit M jobs through the web server and follow every
job's SSE stream to its end; then every job is checked in Redis. Nothing may be lost or
run twice.

    python -m bench.load [--clients 50] [--jobs 500] [--workers 1 --pool threads --concurrency 8]
                         [--model PATH] [--max-new-tokens 16] [--method paged]

Starts its own redis-server, Celery worker(s) and web server on free ports; without --model
it builds the tiny random-weight test model in a temporary folder (the benchmark measures
the service, not the model). Prints jobs/s, p50/p99 submit latency and time to first event,
and the counts of lost, duplicated and failed jobs; writes results/load.csv (one row per
job), results/load.json (summary, settings, machine) and results/load.png.

Definitions: *lost* = accepted (202) but no terminal event reached its client, or the job
is not in a terminal state at the end; *duplicated* = a job with more than one terminal
event, a stream that repeated an event seq, or one job id handed out twice; *failed* =
ended in a state other than ``succeeded``; *submit errors* = POSTs that got no 202;
*re-run* = jobs that needed a second attempt (expected only with --kill-worker-after);
*text mismatches* = the final attempt's streamed tokens differ from the stored result.

    python -m bench.load --connections 2000 --slowloris 200 [--loaded-s 40]

is the connections mode instead (:mod:`bench.load_connections`): thousands of held SSE
streams and slowloris sockets against the web alone, while ``/healthz`` latency and a new
job's time to first token are measured; writes results/connections.{json,csv,png}.
"""
from __future__ import annotations

import argparse
import concurrent.futures as futures
import tempfile
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import requests

from bench.local_stack import tiny_model, web_is_up
from bench.stats import machine_info, percentile, print_table, pyplot, write_csv, write_json
from core.events import TERMINAL_EVENTS
from core.jobs import JobNotFound, JobStore
from core.workers import list_workers
from tests.harness.client import JobTrace, submit_and_follow
from tests.harness.stack import Process, Stack, start_redis, job_store, wait_until


@dataclass
class JobRow:
    client: int
    index: int
    started_s: float  # since the run began
    job_id: str = ""
    submit_status: int = 0
    submit_ms: float = float("nan")
    first_event_ms: float = float("nan")
    first_token_ms: float = float("nan")
    total_ms: float = float("nan")
    terminal: str = ""  # terminal event the client saw
    repeated_seqs: int = 0
    state: str = ""  # state in Redis at the end
    attempt: int = 0
    terminal_events: int = 0
    text_matches: bool = False
    error: str = ""


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clients", type=int, default=50)
    parser.add_argument("--jobs", type=int, default=500, help="total jobs (split evenly across clients)")
    parser.add_argument("--model", default="", help="model folder or id (default: the tiny test model)")
    parser.add_argument("--method", default="paged", help="generation method of every job")
    parser.add_argument("--max-new-tokens", type=int, default=16)
    parser.add_argument("--workers", type=int, default=1, help="Celery worker processes")
    parser.add_argument("--pool", default="threads", choices=("threads", "prefork"))
    parser.add_argument("--concurrency", type=int, default=8, help="jobs at once per worker process")
    parser.add_argument("--web-workers", type=int, default=2)
    parser.add_argument("--warmup", type=int, default=4, help="jobs run (and not counted) before the load")
    parser.add_argument("--timeout", type=float, default=600, help="seconds a client waits for one job")
    parser.add_argument("--kill-worker-after", type=float, default=0,
                        help="SIGKILL worker 0 (main process and pool) this many seconds into the load "
                             "(needs --workers 2 or more); its jobs must still complete, re-run elsewhere")
    parser.add_argument("--lease-s", type=int, default=10, help="job lease: how soon a dead worker's jobs re-run")
    parser.add_argument("--output", default="results/load.csv")
    parser.add_argument("--connections", type=int, default=0,
                        help="connections mode: this many held SSE streams (see bench.load_connections)")
    parser.add_argument("--slowloris", type=int, default=200, help="connections mode: slowloris sockets")
    parser.add_argument("--loaded-s", type=float, default=40.0, help="connections mode: seconds under load")
    return parser.parse_args()


def start_stack(args, folder: Path) -> tuple[list[Process], str, JobStore]:
    redis_proc, url = start_redis(folder)
    model = args.model or tiny_model(folder / "tiny-model")
    env = {"MINISERVE_MODEL": model, "MINISERVE_DEVICE": "cpu", "MINISERVE_THREADS": "1",
           "MINISERVE_LOG_LEVEL": "WARNING", "MINISERVE_JSON_LOGS": "true",
           "MINISERVE_MAX_QUEUE_DEPTH": str(args.jobs * 2), "MINISERVE_RATE_LIMIT_PER_MINUTE": "0",
           "MINISERVE_WEB_WORKERS": str(args.web_workers), "MINISERVE_MAX_BATCH": str(args.concurrency),
           "MINISERVE_LEASE_S": str(args.lease_s)}
    if not args.model:
        env["MINISERVE_DTYPE"] = "float32"
    stack = Stack(redis_url=url, env_overrides=env, log_dir=folder)
    procs = [redis_proc]
    procs += [stack.start_worker(name=f"load{i}", pool=args.pool, concurrency=args.concurrency)
              for i in range(args.workers)]
    web, base_url = stack.start_web()
    procs.append(web)
    store = job_store(url)
    expected = args.workers * (args.concurrency if args.pool == "prefork" else 1)
    wait_until(lambda: sum(bool(w["info"].get("engine_loaded")) for w in list_workers(store.client, 30)) >= expected,
               300, what="workers with a loaded model")
    wait_until(lambda: web_is_up(base_url), 60, what="web server")
    return procs, base_url, store


def job_body(args, client: int, index: int) -> dict:
    return {"prompt": f"Client {client}, request {index}: write one short sentence about queues.",
            "max_new_tokens": args.max_new_tokens, "generation_method": args.method}


def run_client(args, base_url: str, client: int, per_client: int, t0: float) -> list[JobRow]:
    session = requests.Session()
    rows = []
    for index in range(per_client):
        row = JobRow(client, index, started_s=time.perf_counter() - t0)
        try:
            trace = submit_and_follow(base_url, job_body(args, client, index), session, timeout_s=args.timeout)
            fill_from_trace(row, trace)
        except requests.HTTPError as exc:
            row.submit_status, row.error = exc.response.status_code, f"HTTP {exc.response.status_code}"
        except Exception as exc:  # noqa: BLE001 - a client's failure is a result to count, not a crash
            row.error = type(exc).__name__
        rows.append(row)
    return rows


def fill_from_trace(row: JobRow, trace: JobTrace) -> None:
    row.job_id, row.submit_status = trace.job_id, 202
    row.submit_ms = trace.submit_s * 1000
    row.first_event_ms = (trace.first_event_s or float("nan")) * 1000
    row.first_token_ms = (trace.first_token_s or float("nan")) * 1000
    row.total_ms = (trace.total_s or float("nan")) * 1000
    row.terminal = trace.terminal or ""
    row.repeated_seqs = len(trace.seqs) - len(set(trace.seqs))
    row._text = trace.text  # type: ignore[attr-defined]


def check_in_redis(store: JobStore, rows: list[JobRow]) -> None:
    """What the store says about every accepted job (waits briefly for stragglers)."""
    accepted = [r for r in rows if r.job_id]
    try:
        wait_until(lambda: all(_ended(store, r.job_id) for r in accepted), 30, interval_s=0.5, what="jobs ended")
    except TimeoutError:
        pass
    for row in accepted:
        try:
            record = store.get(row.job_id)
        except JobNotFound:
            row.state = "missing"
            continue
        events = store.events(row.job_id)
        row.state, row.attempt = record.state, record.attempt
        row.terminal_events = sum(e.type in TERMINAL_EVENTS for e in events)
        streamed = "".join(e.data.get("text", "") for e in events if e.type == "token" and e.attempt == record.attempt)
        client_text = getattr(row, "_text", None) if record.attempt == 1 else streamed  # a re-run streams both
        row.text_matches = bool(record.result) and streamed == record.result.get("text") == client_text


def _ended(store: JobStore, job_id: str) -> bool:
    try:
        return store.get(job_id).is_terminal
    except JobNotFound:
        return True


def summarize_run(rows: list[JobRow], seconds: float) -> dict:
    accepted = [r for r in rows if r.job_id]
    ok = [r for r in accepted if r.terminal == "done"]
    lost = [r for r in accepted if not r.terminal or r.state in ("queued", "running", "missing")]
    duplicated = [r for r in accepted if r.terminal_events > 1 or r.repeated_seqs]
    duplicated_ids = len(accepted) - len({r.job_id for r in accepted})
    failed = [r for r in accepted if r.state and r.state not in ("succeeded", "queued", "running", "missing")]
    return {
        "jobs": len(rows), "accepted": len(accepted), "seconds": round(seconds, 2),
        "jobs_per_s": round(len(ok) / seconds, 2),
        "submit_p50_ms": percentile([r.submit_ms for r in accepted], 50),
        "submit_p99_ms": percentile([r.submit_ms for r in accepted], 99),
        "first_event_p50_ms": percentile([r.first_event_ms for r in ok], 50),
        "first_event_p99_ms": percentile([r.first_event_ms for r in ok], 99),
        "first_token_p50_ms": percentile([r.first_token_ms for r in ok if r.first_token_ms == r.first_token_ms], 50),
        "total_p50_ms": percentile([r.total_ms for r in ok], 50),
        "total_p99_ms": percentile([r.total_ms for r in ok], 99),
        "lost": len(lost), "duplicated": len(duplicated) + duplicated_ids, "failed": len(failed),
        "submit_errors": len(rows) - len(accepted),
        "text_mismatches": sum(1 for r in ok if not r.text_matches),
        "re_run": sum(1 for r in accepted if r.attempt > 1),
    }


def kill_worker(worker: Process, t0: float) -> None:
    worker.kill()
    print(f"killed {worker.name} (SIGKILL, main process and pool) at {time.perf_counter() - t0:.1f}s")


def warm_up(args, base_url: str) -> None:
    with futures.ThreadPoolExecutor(max(1, args.warmup)) as pool:
        list(pool.map(lambda i: submit_and_follow(base_url, job_body(args, -1, i), timeout_s=120),
                      range(args.warmup)))


def main() -> None:
    args = parse_args()
    if args.connections:
        from bench import load_connections as mode

        return mode.main(mode.ConnectionRun(connections=args.connections, slowloris=args.slowloris,
                                            loaded_s=args.loaded_s, web_workers=args.web_workers))
    per_client = max(1, args.jobs // args.clients)
    folder = Path(tempfile.mkdtemp(prefix="miniserve-load-"))
    procs, base_url, store = start_stack(args, folder)
    try:
        warm_up(args, base_url)
        t0 = time.perf_counter()
        if args.kill_worker_after > 0:
            threading.Timer(args.kill_worker_after, kill_worker, args=(procs[1], t0)).start()
        with futures.ThreadPoolExecutor(args.clients) as pool:
            parts = pool.map(lambda c: run_client(args, base_url, c, per_client, t0), range(args.clients))
            rows = [row for part in parts for row in part]
        seconds = time.perf_counter() - t0
        check_in_redis(store, rows)
    finally:
        for proc in reversed(procs):
            proc.stop()
    summary = summarize_run(rows, seconds)
    report(args, rows, summary, folder)


def report(args, rows: list[JobRow], summary: dict, folder: Path) -> None:
    setup = {"clients": args.clients, "jobs_per_client": max(1, args.jobs // args.clients),
             "workers": args.workers, "pool": args.pool, "concurrency": args.concurrency,
             "method": args.method, "max_new_tokens": args.max_new_tokens, "model": args.model or "tiny (test model)",
             "worker_torch_threads": 1, "web_workers": args.web_workers, "lease_s": args.lease_s,
             "kill_worker_after_s": args.kill_worker_after}
    machine = machine_info()
    print("setup:", setup)
    print("machine:", machine)
    columns = ["jobs", "seconds", "jobs_per_s", "submit_p50_ms", "submit_p99_ms", "first_event_p50_ms",
               "first_event_p99_ms", "total_p50_ms", "total_p99_ms"]
    print_table([summary], columns)
    print_table([summary], ["lost", "duplicated", "failed", "submit_errors", "text_mismatches", "re_run"])
    out = Path(args.output)
    write_csv(out, [{k: v for k, v in asdict(r).items()} for r in rows])
    write_json(out.with_suffix(".json"), {"setup": setup, "machine": machine, "summary": summary,
                                          "logs": str(folder)})
    plot(rows, out.with_suffix(".png"), summary)
    print(f"wrote {out}, {out.with_suffix('.json')}, {out.with_suffix('.png')} (process logs in {folder})")


def plot(rows: list[JobRow], path: Path, summary: dict) -> None:
    plt = pyplot()
    done = [r for r in rows if r.terminal == "done"]
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
    for metric, label in (("submit_ms", "submit (POST /jobs)"), ("first_event_ms", "first SSE event"),
                          ("total_ms", "terminal event")):
        values = sorted(getattr(r, metric) for r in done)
        axes[0].plot(values, [i / max(1, len(values) - 1) for i in range(len(values))], label=label)
    axes[0].set_xscale("log")
    axes[0].set_xlabel("ms from submit (log)")
    axes[0].set_ylabel("fraction of jobs")
    axes[0].legend()
    axes[0].set_title("latency CDF")
    ends = sorted((r.started_s + r.total_ms / 1000) for r in done)
    axes[1].plot(ends, range(1, len(ends) + 1))
    axes[1].set_xlabel("seconds since start")
    axes[1].set_ylabel("jobs completed")
    axes[1].set_title(f"{summary['jobs_per_s']} jobs/s; lost {summary['lost']}, duplicated {summary['duplicated']}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    main()
