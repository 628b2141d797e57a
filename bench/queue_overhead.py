"""What the queue costs: the same short generation called directly on the engine and through
web -> Redis -> Celery worker -> Redis -> web (SSE), interleaved after warmup; then a burst of
short jobs counting lost and duplicated ones.

    python -m bench.queue_overhead [--model default] [--repeats 20] [--burst 200]
    python -m bench.queue_overhead --batch-api [--burst 200] [--batch-clients 8] [--workers 2]

    python -m bench.queue_overhead --served [--clients 1 8 16] [--rounds 2] [--new-tokens 64]
                                   [--llama-server PATH]

``--served``: aggregate tokens/s and TTFT of N streaming ``/v1`` chat clients against the
in-process batched engine on the same requests, in one run, with the CPU time the web, the
worker and Redis spend per 1,000 tokens (``bench/queue_served.py``; ``--llama-server`` adds
llama.cpp's own server beside them); writes results/queue_served.json.

``--batch-api``: the same ``--burst`` chat requests as one Batch API batch against separate
``/v1`` calls from ``--batch-clients`` clients (``bench/batch_api.py``), on ``--workers``
workers of the production pool (threads); writes results/batch_api.json.

``--batch-create``: ``POST /v1/batches`` answer time, the intake's time to read every line,
and each web process's RSS growth, for a ``--create-lines`` file and one ~20 MB line
(``bench/batch_create.py``; redis and the web only); writes results/batch_create.json.

``--priorities``: an interactive chat's time to first token alone and beside a running Batch
API file of ``--batch-lines`` lines, with the fair gate on and off (``bench/priorities.py``);
writes results/priorities.json.

``--fair-share``: key B's jobs beside key A's flood of ``--flood``, gate on and off, and the
error of queued jobs' estimated starts (``bench/fair_share.py``); writes results/fair_share.json.

Starts its own redis-server, worker and web server on free ports. Writes
results/queue_overhead.csv, results/queue_overhead.json and results/queue_overhead.png.
"""
from __future__ import annotations

import argparse
import concurrent.futures as futures
import os
import time
from pathlib import Path

import requests

from bench import batch_api
from bench.local_stack import serving_stack
from bench.stats import machine_info, print_table, pyplot, summarize, write_csv, write_json
from core.events import TERMINAL_EVENTS
from core.jobs import JobStore
from core.settings import load_settings
from core.workers import list_workers
from tests.harness.client import submit_and_follow
from tests.harness.stack import Stack, start_redis, job_store, wait_until

PROMPT = "Name three primary colors."


def direct_call(engine, request) -> tuple[float, float]:
    """Wall-clock time to first text and total, measured around the engine call."""
    from engine.types import GenerationRequest  # noqa: F401 - the engine is only imported here

    first: list[float] = []
    started = time.perf_counter()
    engine.generate(request, on_text=lambda _t: first or first.append(time.perf_counter() - started))
    return first[0] if first else float("nan"), time.perf_counter() - started


def queued_call(base_url: str, body: dict, session: requests.Session) -> tuple[float, float]:
    trace = submit_and_follow(base_url, body, session)
    assert trace.terminal == "done", trace
    return trace.first_token_s or float("nan"), trace.total_s or float("nan")


def burst(base_url: str, store: JobStore, count: int, clients: int, body: dict) -> dict:
    """Submit ``count`` jobs from ``clients`` threads; wait for all; count lost/duplicated."""
    started = time.perf_counter()
    with futures.ThreadPoolExecutor(clients) as pool:
        ids = list(pool.map(lambda _: requests.post(f"{base_url}/jobs", json=body, timeout=60).json()["id"],
                            range(count)))

    def all_ended() -> bool:
        return all(store.get(i).is_terminal for i in ids)

    try:
        wait_until(all_ended, timeout_s=max(120, count * 2), interval_s=0.2, what="burst jobs")
    except TimeoutError:
        pass
    elapsed = time.perf_counter() - started
    terminal_counts = [sum(e.type in TERMINAL_EVENTS for e in store.events(i)) for i in ids]
    states = [store.get(i).state for i in ids]
    return {"jobs": count, "clients": clients, "seconds": round(elapsed, 2),
            "jobs_per_s": round(count / elapsed, 2),
            "succeeded": states.count("succeeded"),
            "lost": sum(1 for c in terminal_counts if c == 0),
            "duplicated": sum(1 for c in terminal_counts if c > 1),
            "unique_ids": len(set(ids))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="default")
    parser.add_argument("--method", default="custom_cache")
    parser.add_argument("--max-new-tokens", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--burst", type=int, default=200)
    parser.add_argument("--burst-clients", type=int, default=20)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--output", default="results/queue_overhead.csv")
    parser.add_argument("--batch-api", action="store_true", help="compare a batch with separate /v1 calls")
    parser.add_argument("--batch-clients", type=int, default=8)
    parser.add_argument("--workers", type=int, default=2, help="--batch-api: worker processes")
    parser.add_argument("--served", action="store_true", help="/v1 clients against the in-process engine")
    parser.add_argument("--clients", type=int, nargs="+", default=[1, 8, 16], help="--served: concurrencies")
    parser.add_argument("--rounds", type=int, default=2, help="--served: chats per client")
    parser.add_argument("--new-tokens", type=int, default=64, help="--served: max_tokens of each chat")
    parser.add_argument("--served-repeats", type=int, default=3, help="--served: interleaved rounds")
    parser.add_argument("--llama-server", default=os.environ.get("MINISERVE_LLAMA_SERVER", ""),
                        help="--served: also run llama.cpp's llama-server binary (or MINISERVE_LLAMA_SERVER)")
    parser.add_argument("--priorities", action="store_true",
                        help="an interactive chat beside a Batch API file, fair gate on and off")
    parser.add_argument("--batch-lines", type=int, default=400, help="--priorities: lines in the batch")
    parser.add_argument("--probes", type=int, default=6, help="--priorities: chats measured per phase")
    parser.add_argument("--fair-share", action="store_true",
                        help="key B's jobs beside key A's flood, gate on and off, and the estimated starts' error")
    parser.add_argument("--flood", type=int, default=300, help="--fair-share: key A's jobs")
    parser.add_argument("--guests", type=int, default=10, help="--fair-share: key B's jobs")
    parser.add_argument("--batch-create", action="store_true",
                        help="POST /v1/batches time and web RSS growth for a large file and a 20 MB line")
    parser.add_argument("--create-lines", type=int, default=50_000, help="--batch-create: lines in the file")
    args = parser.parse_args()
    if args.batch_create:
        from bench import batch_create

        batch_create.run(args.model, args.create_lines, Path(args.output).with_name("batch_create.json"))
        return None
    if args.fair_share:
        from bench import fair_share

        fair_share.compare(lambda window, reserved: _gated_stack(args, window, reserved, keys="key-a,key-b"),
                           args.flood, args.guests, args.max_new_tokens, Path(args.output).with_name("fair_share.json"))
        return None
    if args.priorities:
        from bench import priorities

        priorities.compare(lambda window, reserved: _gated_stack(args, window, reserved), args.batch_lines,
                           args.probes, args.max_new_tokens, Path(args.output).with_name("priorities.json"))
        return None
    if args.served:
        from bench import queue_served

        return queue_served.main(queue_served.ServedArgs(
            model=args.model, clients=args.clients, rounds=args.rounds, new_tokens=args.new_tokens,
            repeats=args.served_repeats, threads=args.threads, llama_server=args.llama_server))

    env = {"MINISERVE_MODEL": args.model, "MINISERVE_THREADS": str(args.threads), "MINISERVE_JSON_LOGS": "true",
           "MINISERVE_LOG_LEVEL": "WARNING", "MINISERVE_MAX_QUEUE_DEPTH": str(args.burst * 2)}
    redis_proc, url = start_redis(Path("/tmp"))
    stack = Stack(redis_url=url, env_overrides=env)
    workers = ([stack.start_worker(name=f"w{i}", pool="threads", concurrency=8) for i in range(args.workers)]
               if args.batch_api else [stack.start_worker()])
    web, base_url = stack.start_web()
    store = job_store(url)
    try:
        wait_until(lambda: sum(bool(w["info"].get("engine_loaded")) for w in list_workers(store.client, 15))
                   >= len(workers), 300, what="workers")
        wait_until(lambda: _up(base_url), 30, what="web server")
        if args.batch_api:
            batch_api.compare(base_url, args.burst, args.batch_clients, args.max_new_tokens,
                              Path(args.output).with_name("batch_api.json"))
            return
        rows = run_interleaved(args, base_url)
        burst_result = burst(base_url, store, args.burst, args.burst_clients,
                             {"prompt": "Hi", "max_new_tokens": 1, "generation_method": args.method})
    finally:
        for proc in (web, *workers, redis_proc):
            proc.stop()
    report(args, rows, burst_result)


def _gated_stack(args, window: int, reserved: int, keys: str = ""):
    """A serving stack (one 8-slot worker) with the fair gate's window (0: off) and reserved
    slots set (and ``keys``: API keys); yields the web's base URL once the model is loaded."""
    env = {"MINISERVE_MODEL": args.model, "MINISERVE_THREADS": str(args.threads), "MINISERVE_JSON_LOGS": "true",
           "MINISERVE_LOG_LEVEL": "WARNING", "MINISERVE_MAX_QUEUE_DEPTH": "0", "MINISERVE_API_KEYS": keys,
           "MINISERVE_QUEUE_WINDOW": str(window), "MINISERVE_RESERVED_SLOTS": str(reserved)}
    return serving_stack(env, up=_up, load_s=300)


def _up(base_url: str) -> bool:
    try:
        return requests.get(f"{base_url}/healthz", timeout=2).status_code < 500
    except requests.RequestException:
        return False


def run_interleaved(args, base_url: str) -> list[dict]:
    import torch

    from engine.engine import Engine
    from engine.types import GenerationRequest, SamplingParams

    torch.set_num_threads(args.threads)
    engine = Engine(load_settings(model=args.model, threads=args.threads))
    request = GenerationRequest(messages=[{"role": "user", "content": PROMPT}], method=args.method,
                                sampling=SamplingParams(max_new_tokens=args.max_new_tokens))
    body = {"prompt": PROMPT, "max_new_tokens": args.max_new_tokens, "generation_method": args.method}
    session = requests.Session()
    rows = []
    for i in range(args.warmup + args.repeats):
        for path in ("direct", "queue"):
            ttft, total = direct_call(engine, request) if path == "direct" else queued_call(base_url, body, session)
            if i >= args.warmup:
                rows.append({"run": i - args.warmup, "path": path, "ttft_ms": ttft * 1000, "total_ms": total * 1000})
    return rows


def report(args, rows: list[dict], burst_result: dict) -> None:
    table = []
    for path in ("direct", "queue"):
        ttft = summarize([r["ttft_ms"] for r in rows if r["path"] == path])
        total = summarize([r["total_ms"] for r in rows if r["path"] == path])
        table.append({"path": path, "ttft_p50_ms": ttft["p50"], "ttft_p90_ms": ttft["p90"],
                      "total_p50_ms": total["p50"], "total_p90_ms": total["p90"]})
    added = {"ttft_p50_added_ms": table[1]["ttft_p50_ms"] - table[0]["ttft_p50_ms"],
             "total_p50_added_ms": table[1]["total_p50_ms"] - table[0]["total_p50_ms"]}
    print_table(table, list(table[0]))
    print(f"queue adds {added['ttft_p50_added_ms']:.1f} ms p50 to time to first token, "
          f"{added['total_p50_added_ms']:.1f} ms p50 to total latency")
    print("burst:", burst_result)
    out = Path(args.output)
    write_csv(out, rows)
    write_json(out.with_suffix(".json"), {"args": vars(args), "machine": machine_info(), "summary": table,
                                          "added": added, "burst": burst_result})
    plot(rows, out.with_suffix(".png"))


def plot(rows: list[dict], path: Path) -> None:
    plt = pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.5))
    for ax, metric in zip(axes, ("ttft_ms", "total_ms")):
        data = [[r[metric] for r in rows if r["path"] == p] for p in ("direct", "queue")]
        ax.boxplot(data, tick_labels=["direct engine", "through the queue"])
        ax.set_title(metric.replace("_ms", " (ms)"))
    fig.suptitle("Queue overhead: same generation, direct vs web->Redis->worker")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    main()
