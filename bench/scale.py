"""Scale-out benchmark (issue 16): more worker processes, cache-aware routing, a worker dying.

    flock /tmp/miniserve-heavy.lock python -m bench.scale [--parts a,b,c] [--reps 2]

(a) queue layer: jobs/s of 1, 2 and 4 worker processes on the tiny random-weight model, jobs
    sent straight to the broker (no web), runs interleaved ``--reps`` times, with the workers
    not pinned (the default) and pinned one per core (``MINISERVE_WORKER_CPUS``);
(b) routing: two real-model workers behind the web, 4 system prompts of about 1,000 tokens
    x 12 jobs each, interleaved, 4 clients; routing off, then on, each with fresh workers
    (empty caches). Each worker's KV pool (``--kv-blocks``, 160 blocks of 16 tokens) holds
    the two prompts running on it plus a little: about half of the four-prompt working set,
    so the cluster's cache only holds the working set when it is partitioned (with a pool
    that holds every prompt, routing only saves each worker's first miss);
(c) a worker SIGKILLed while it runs (and has waiting) jobs routed to it: every job must end
    on the other worker within lease + 30 s, with exactly one terminal event;
(d) Redis cost: commands per job and per generated token (INFO commandstats, idle background
    subtracted), idle load of one worker, stream bytes per event -- the inputs of the
    "100 workers" arithmetic in docs/deployment.md.

Writes results/scale.csv (one row per run or job), results/scale.json (summary, targets,
machine, command) and results/scale.png.
"""
from __future__ import annotations

import argparse
import concurrent.futures as futures
import os
import shlex
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import requests

from bench.local_stack import tiny_model, web_is_up
from bench.scale_plot import plot
from bench.scale_redis_cost import part_d
from bench.stats import cpu_model, machine_summary, percentile, print_table, write_csv, write_json
from core import keys
from core.events import TERMINAL_EVENTS, TERMINAL_STATES
from core.jobs import JobStore
from core.routing import ALIVE_S
from core.tasks import QUEUE_FOR_JOB_TYPE, TASK_FOR_JOB_TYPE
from core.workers import list_workers
from tests.harness.client import submit_and_follow
from tests.harness.stack import Process, Stack, job_store, start_redis, wait_until

TOPICS = ("orbital mechanics", "medieval bookbinding", "sourdough fermentation", "tidal power stations")


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--parts", default="a,b,c,d")
    parser.add_argument("--reps", type=int, default=2, help="(a) interleaved repetitions")
    parser.add_argument("--workers-a", default="1,2,4")
    parser.add_argument("--jobs-a", type=int, default=1000)
    parser.add_argument("--pinning", choices=["both", "off", "on"], default="both",
                        help="(a) off: workers float over all CPUs (the default setting); on: worker i "
                             "gets MINISERVE_WORKER_CPUS=i mod CPUs; both: interleaved")
    parser.add_argument("--model", default="default", help="(b) model of the routing run")
    parser.add_argument("--prompt-tokens", type=int, default=1000)
    parser.add_argument("--jobs-per-prompt", type=int, default=12)
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=16)
    parser.add_argument("--kv-blocks", type=int, default=160, help="(b) KV blocks per worker (16 tokens each)")
    parser.add_argument("--lease-s", type=int, default=10, help="(c) job lease")
    parser.add_argument("--output", default="results/scale")
    return parser.parse_args()




class Cluster:
    """A Redis, N workers and optionally a web server; everything stopped on exit."""

    def __init__(self, folder: Path, env: dict[str, str]) -> None:
        self.exit = ExitStack()
        folder.mkdir(parents=True, exist_ok=True)
        redis_proc, self.url = start_redis(folder)
        self.exit.callback(redis_proc.kill)
        self.stack = Stack(redis_url=self.url, env_overrides=env, log_dir=folder)
        self.store = job_store(self.url)
        self.workers: list[Process] = []

    def start_workers(self, names: list[str], concurrency: int, timeout_s: float = 300, pinned: bool = False) -> None:
        cpus = sorted(os.sched_getaffinity(0))
        for i, name in enumerate(names):
            env = {"MINISERVE_WORKER_CPUS": str(cpus[i % len(cpus)])} if pinned else {}
            proc = self.stack.start_worker(name=name, pool="threads", concurrency=concurrency, **env)
            self.exit.callback(proc.kill)
            self.workers.append(proc)
        loaded = lambda: sum(bool(w["info"].get("engine_loaded")) for w in list_workers(self.store.client, 15))
        wait_until(lambda: loaded() >= len(self.workers), timeout_s, what="workers with a loaded model")

    def start_web(self, **env: str) -> str:
        proc, base = self.stack.start_web(**env)
        self.exit.callback(proc.stop)
        wait_until(lambda: web_is_up(base), 60, what="web server")
        return base

    def close(self) -> None:
        self.exit.close()


def wait_all(store: JobStore, ids: list[str], timeout_s: float) -> None:
    """Poll only the jobs still open, twice a second: the poller shares the workers' two cores,
    so polling every id five times a second would be charged to the system under test."""
    open_ids = list(ids)

    def done() -> bool:
        pipe = store.client.pipeline(transaction=False)
        for job_id in open_ids:
            pipe.hget(keys.job_key(job_id), "state")
        open_ids[:] = [j for j, state in zip(open_ids, pipe.execute()) if state not in TERMINAL_STATES]
        return not open_ids

    wait_until(done, timeout_s, interval_s=0.5, what=f"{len(ids)} jobs to end")


# ---- (a) queue layer ---------------------------------------------------------------------
STAGING = "staging"  # (a) jobs are queued here first, then handed to the workers in one RENAME


def send_jobs(cluster: Cluster, count: int, tag: str, queue: str = "generation") -> list[str]:
    from celery import Celery

    client = Celery("bench-scale", broker=cluster.url)
    ids = []
    try:
        for i in range(count):
            request = {"messages": [{"role": "user", "content": f"{tag} job {i}: say hi"}], "method": "paged",
                       "sampling": {"max_new_tokens": 8, "temperature": 0.0}}
            record = cluster.store.create("generate", QUEUE_FOR_JOB_TYPE["generate"], request)
            client.send_task(TASK_FOR_JOB_TYPE["generate"], args=[record.id, 0], task_id=record.id, queue=queue)
            ids.append(record.id)
    finally:
        client.close()
    return ids


def part_a(args, folder: Path, model: str) -> list[dict[str, Any]]:
    rows = []
    env = {"MINISERVE_MODEL": model, "MINISERVE_DTYPE": "float32", "MINISERVE_DEVICE": "cpu",
           "MINISERVE_THREADS": "1", "MINISERVE_LOG_LEVEL": "WARNING"}
    pinnings = {"both": [False, True], "off": [False], "on": [True]}[args.pinning]
    for rep in range(args.reps):
        for pinned in pinnings:
            for n in [int(x) for x in args.workers_a.split(",")]:
                rows.append(queue_layer_run(folder / f"a-{rep}-{n}-{int(pinned)}", env, n, pinned, args.jobs_a, rep))
                print(f"(a) rep {rep}: {n} worker(s), pinned={pinned}: {rows[-1]['jobs_per_s']} jobs/s", flush=True)
    return rows


def queue_layer_run(folder: Path, env: dict[str, str], n: int, pinned: bool, jobs: int, rep: int) -> dict[str, Any]:
    cluster = Cluster(folder, env)
    try:
        cluster.start_workers([f"a{i}" for i in range(n)], concurrency=8, pinned=pinned)
        wait_all(cluster.store, send_jobs(cluster, 8 * n, "warm-up"), 120)
        # Queue every job first (the submitter's CPU stays out of the measured window),
        # then make them all visible to the workers at once.
        ids = send_jobs(cluster, jobs, "measured", queue=STAGING)
        released = time.time()
        cluster.store.client.rename(STAGING, QUEUE_FOR_JOB_TYPE["generate"])
        wait_all(cluster.store, ids, 600)
        seconds = max(cluster.store.get(j).finished_at for j in ids) - released
        states = [cluster.store.get(j).state for j in ids]
        return {"part": "a", "rep": rep, "workers": n, "pinned": pinned, "jobs": len(ids),
                "seconds": round(seconds, 3), "jobs_per_s": round(len(ids) / seconds, 2),
                "succeeded": states.count("succeeded")}
    finally:
        cluster.close()


# ---- (b) routing -------------------------------------------------------------------------
def system_prompts(model: str, tokens: int) -> list[str]:
    """Four distinct system prompts of about ``tokens`` tokens (counted with the model's tokenizer)."""
    from tokenizers import Tokenizer

    from core.settings import load_settings
    from core.model_source import local_model_dir as model_folder

    tokenizer = Tokenizer.from_file(str(model_folder(load_settings(model=model)) / "tokenizer.json"))
    prompts = []
    for k, topic in enumerate(TOPICS):
        lines = [f"{topic.title()} desk, assistant {k}. You answer questions about {topic} only."]
        rule = 0
        while len(tokenizer.encode("\n".join(lines)).ids) < tokens:
            rule += 1
            lines.append(f"Rule {rule} for {topic}: when asked about case {rule * 7 + k}, cite section "
                         f"{rule}.{k} and keep the answer under {rule % 5 + 2} sentences.")
        prompts.append("\n".join(lines))
    return prompts


def routing_run(args, folder: Path, prompts: list[str], routed: bool) -> tuple[list[dict[str, Any]], float]:
    env = {"MINISERVE_MODEL": args.model, "MINISERVE_THREADS": "1", "MINISERVE_LOG_LEVEL": "WARNING",
           "MINISERVE_KV_NUM_BLOCKS": str(args.kv_blocks), "MINISERVE_MAX_QUEUE_DEPTH": "0",
           "MINISERVE_ROUTE_BY_PREFIX": "true" if routed else "false"}
    cluster = Cluster(folder / f"b-{'on' if routed else 'off'}", env)
    try:
        cluster.start_workers(["ra", "rb"], concurrency=2)
        base = cluster.start_web()
        jobs = [(i, prompts[i % len(prompts)]) for i in range(len(prompts) * args.jobs_per_prompt)]
        started = time.perf_counter()
        with futures.ThreadPoolExecutor(args.clients) as pool:
            traces = list(pool.map(lambda job: run_routed_job(args, base, *job), jobs))
        wall = time.perf_counter() - started
        rows = []
        for (i, prompt), trace in zip(jobs, traces):
            record = cluster.store.get(trace.job_id)
            usage = (record.result or {}).get("usage", {})
            rows.append({"part": "b", "routing": "on" if routed else "off", "index": i,
                         "prompt": prompts.index(prompt), "worker": record.worker, "state": record.state,
                         "decision": (record.request.get("routing") or {}).get("decision", "disabled"),
                         "ttft_s": round(trace.first_token_s or float("nan"), 3),
                         "total_s": round(trace.total_s or float("nan"), 3),
                         "prompt_tokens": usage.get("prompt_tokens", 0), "cached_tokens": usage.get("cached_tokens", 0),
                         "completion_tokens": usage.get("completion_tokens", 0)})
        return rows, wall
    finally:
        cluster.close()


def run_routed_job(args, base: str, index: int, prompt: str):
    body = {"system": prompt, "prompt": f"Question {index}: which rule covers case {index * 7}? One sentence.",
            "max_new_tokens": args.max_new_tokens, "temperature": 0.0, "generation_method": "paged"}
    return submit_and_follow(base, body, timeout_s=900)


def summarize_routing(rows: list[dict[str, Any]], wall: float, prompt_tokens: int) -> dict[str, Any]:
    seen: set[int] = set()
    repeats = []
    for row in sorted(rows, key=lambda r: r["index"]):
        if row["prompt"] in seen:
            repeats.append(row)
        seen.add(row["prompt"])
    hit = lambda row: row["cached_tokens"] >= prompt_tokens // 2  # most of the system prompt came from cache
    ttfts = [r["ttft_s"] for r in rows]
    return {"jobs": len(rows), "succeeded": sum(r["state"] == "succeeded" for r in rows),
            "ttft_p50_s": round(percentile(ttfts, 50), 3), "ttft_p90_s": round(percentile(ttfts, 90), 3),
            "hit_share_all": round(sum(map(hit, rows)) / len(rows), 3),
            "hit_share_repeats": round(sum(map(hit, repeats)) / max(1, len(repeats)), 3),
            "tokens_per_s": round(sum(r["completion_tokens"] for r in rows) / wall, 2), "wall_s": round(wall, 1),
            "jobs_per_worker": {w: sum(r["worker"] == w for r in rows) for w in sorted({r["worker"] for r in rows})},
            "decisions": {d: sum(r["decision"] == d for r in rows) for d in sorted({r["decision"] for r in rows})}}


def part_b(args, folder: Path) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    prompts = system_prompts(args.model, args.prompt_tokens)
    rows, summary = [], {}
    for routed in (False, True):
        run_rows, wall = routing_run(args, folder, prompts, routed)
        rows += run_rows
        summary["on" if routed else "off"] = summarize_routing(run_rows, wall, args.prompt_tokens)
        print(f"(b) routing {'on' if routed else 'off'}: {summary['on' if routed else 'off']}", flush=True)
    on, off = summary["on"], summary["off"]
    summary["ttft_p50_ratio_off_over_on"] = round(off["ttft_p50_s"] / on["ttft_p50_s"], 2)
    summary["tokens_per_s_ratio_on_over_off"] = round(on["tokens_per_s"] / off["tokens_per_s"], 2)
    return rows, summary


# ---- (c) a worker dies ---------------------------------------------------------------------
def part_c(args, folder: Path, model: str) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    env = {"MINISERVE_MODEL": model, "MINISERVE_DTYPE": "float32", "MINISERVE_DEVICE": "cpu",
           "MINISERVE_THREADS": "1", "MINISERVE_LOG_LEVEL": "WARNING", "MINISERVE_LEASE_S": str(args.lease_s),
           "MINISERVE_ROUTE_MIN_PREFIX_TOKENS": "32", "MINISERVE_MAX_NEW_TOKENS_CAP": "4000"}
    cluster = Cluster(folder / "c", env)
    try:
        cluster.start_workers(["ca", "cb"], concurrency=3)
        base = cluster.start_web()
        body = {"system": "You are the on-call engineer; read the runbook before acting. " * 4,
                "max_new_tokens": 1500, "generation_method": "paged"}
        post = lambda i: requests.post(f"{base}/jobs", json={**body, "prompt": f"incident {i}"}, timeout=15).json()["id"]
        ids = [post(0)]
        wait_until(lambda: cluster.store.get(ids[0]).state == "running", 60, what="first job running")
        ids += [post(i) for i in range(1, 7)]
        holder = cluster.store.get(ids[0]).worker
        victim = next(p for p in cluster.workers if holder.startswith(p.name.removeprefix("worker-") + "@"))
        wait_until(lambda: sum(cluster.store.get(j).state == "running" for j in ids) >= 3, 60, what="3 jobs running")
        time.sleep(1.0)
        states_at_kill = {j: (cluster.store.get(j).state, cluster.store.get(j).worker) for j in ids}
        victim.kill()
        killed_at = time.time()
        wait_all(cluster.store, ids, args.lease_s + 120)
        rows = []
        for job_id in ids:
            record = cluster.store.get(job_id)
            terminal = sum(1 for e in cluster.store.events(job_id) if e.type in TERMINAL_EVENTS)
            rows.append({"part": "c", "job": job_id[:8], "at_kill": states_at_kill[job_id][0],
                         "worker_at_kill": states_at_kill[job_id][1],
                         "routed_to": (record.request.get("routing") or {}).get("worker", ""),
                         "state": record.state, "attempt": record.attempt, "worker": record.worker,
                         "terminal_events": terminal, "finished_after_kill_s": round(record.finished_at - killed_at, 2)})
        budget = args.lease_s + 30
        summary = {"victim": holder, "lease_s": args.lease_s, "budget_s": budget,
                   "max_finished_after_kill_s": max(r["finished_after_kill_s"] for r in rows),
                   "all_succeeded": all(r["state"] == "succeeded" for r in rows),
                   "all_one_terminal_event": all(r["terminal_events"] == 1 for r in rows),
                   "all_finished_elsewhere": all(r["worker"] != holder for r in rows)}
        summary["within_budget"] = summary["max_finished_after_kill_s"] <= budget
        print(f"(c) {summary}", flush=True)
        return rows, summary
    finally:
        cluster.close()


def main() -> None:
    args = parse_args()
    parts = set(args.parts.split(","))
    out = Path(args.output)
    out.parent.mkdir(parents=True, exist_ok=True)
    folder = Path(tempfile.mkdtemp(prefix="miniserve-scale-"))
    model = tiny_model(folder / "tiny-model") if parts & {"a", "c", "d"} else ""
    rows: list[dict[str, Any]] = []
    summary: dict[str, Any] = {"command": " ".join(shlex.quote(a) for a in [sys.executable, "-m", "bench.scale",
                                                                          *sys.argv[1:]]),
                               "machine": {**machine_summary(), "cpu": cpu_model()},
                               "alive_s": ALIVE_S}
    if "a" in parts:
        rows_a = part_a(args, folder, model)
        rows += rows_a
        summary["a"] = summarize_a(rows_a)
    if "b" in parts:
        rows_b, summary["b"] = part_b(args, folder)
        rows += rows_b
    if "c" in parts:
        rows_c, summary["c"] = part_c(args, folder, model)
        rows += rows_c
    if "d" in parts:
        summary["d"] = part_d(args, folder, model, Cluster)
    write_csv(out.with_suffix(".csv"), rows)
    write_json(out.with_suffix(".json"), summary)
    plot(rows, summary, out.with_suffix(".png"))
    print(f"wrote {out}.csv, {out}.json, {out}.png")


def summarize_a(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Median jobs/s per (pinning, workers); x_one against one worker with the same pinning."""
    by_key: dict[tuple[bool, int], list[float]] = {}
    for row in rows:
        by_key.setdefault((bool(row.get("pinned")), row["workers"]), []).append(row["jobs_per_s"])
    medians = {key: percentile(v, 50) for key, v in sorted(by_key.items())}
    table = []
    for (pinned, n), median in medians.items():
        one = medians.get((pinned, 1)) or float("nan")
        table.append({"pinned": pinned, "workers": n, "jobs_per_s_median": round(median, 2),
                      "x_one": round(median / one, 2)})
    print_table(table, ["pinned", "workers", "jobs_per_s_median", "x_one"])
    return {"runs": table}


if __name__ == "__main__":
    main()
