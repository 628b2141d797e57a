"""``python -m bench.queue_overhead --served``: aggregate tokens/s through ``/v1`` against the
in-process batched engine on the same requests, in one run.

N clients (``--clients``, default 1 8 16) each send ``--rounds`` greedy chats one after
another. ``inproc``: each client is a thread that submits to an :class:`engine.loop.EngineLoop`
in this process (the worker's settings) and reads its text pieces, as a worker's job thread
does. ``v1``: each client posts ``/v1/chat/completions`` with ``stream`` to a local stack
(redis-server, one worker with a threads pool of ``max(clients)`` jobs, the web) and reads
the chunks; tokens are the usage of its final chunk. Paths alternate, ``--repeats`` rounds
(each mode's median run is reported). TTFT is what a client saw from its request to its
first text. Between the /v1 runs' start and end the CPU time of the web, the worker and
redis-server is read from /proc, so the cost of the path shows per 1,000 tokens, whatever
the machine's load. Writes results/queue_served.{csv,json,png}.

``--llama-server PATH`` (or ``MINISERVE_LLAMA_SERVER``) adds ``llama``: llama.cpp's own
server with continuous batching (a slot per client, restarted per concurrency) on the bundled default model's
GGUF (:mod:`bench.llama_served`), the same chats through its OpenAI route.
"""
from __future__ import annotations

import json
import os
import statistics
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

import requests

from bench.served_clients import Mode, Outcome, openai_client, prompt, run_clients
from bench.stats import RESULTS, machine_info, p50, print_table, pyplot, write_csv, write_json

CLK_TCK = os.sysconf("SC_CLK_TCK")


@dataclass
class ServedArgs:
    model: str = "default"
    clients: list[int] = field(default_factory=lambda: [1, 8, 16])
    rounds: int = 2
    new_tokens: int = 64
    repeats: int = 3
    threads: int = 2
    llama_server: str = ""
    output: str = str(RESULTS / "queue_served.csv")


# ---------------------------------------------------------------- CPU time of process trees

def _stat(pid: int) -> tuple[int, float] | None:
    """(parent pid, user+system CPU seconds) of one process, or None when it is gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2:].split()
    return int(fields[1]), (int(fields[11]) + int(fields[12])) / CLK_TCK


def tree_cpu_s(root: int) -> float:
    """CPU seconds of ``root`` and every live descendant (gunicorn's workers, Celery's pool)."""
    stats = {int(p.name): s for p in Path("/proc").iterdir() if p.name.isdigit() and (s := _stat(int(p.name)))}
    children: dict[int, list[int]] = {}
    for pid, (parent, _) in stats.items():
        children.setdefault(parent, []).append(pid)
    total, todo = 0.0, [root]
    while todo:
        pid = todo.pop()
        if pid in stats:
            total += stats[pid][1]
        todo.extend(children.get(pid, []))
    return total


# ---------------------------------------------------------------- the clients

def inproc_client(loop: Any, new_tokens: int) -> Callable[[int, int], Outcome]:
    from engine.types import GenerationRequest, SamplingParams

    def one(client: int, round_: int) -> Outcome:
        request = GenerationRequest(messages=[{"role": "user", "content": prompt(client, round_)}],
                                    method="paged", sampling=SamplingParams(max_new_tokens=new_tokens))
        first: list[float] = []
        started = time.perf_counter()
        result = loop.submit(request).stream(lambda _t: first or first.append(time.perf_counter()))
        return Outcome((first[0] if first else time.perf_counter()) - started, result.usage.completion_tokens)
    return one


# ---------------------------------------------------------------- the run

def measure(mode: Mode, n: int) -> dict[str, Any]:
    if mode.prepare is not None:
        mode.prepare(n)
    before = {label: tree_cpu_s(pid) for label, pid in mode.processes.items()}
    self_before = time.process_time()
    out = mode.run(n)
    thousands = max(out["tokens"], 1) / 1000
    cpu = {label: tree_cpu_s(pid) - before[label] for label, pid in mode.processes.items()}
    if not mode.processes:  # in-process: the engine runs in this process
        cpu = {"engine": time.process_time() - self_before}
    out["cpu_s_per_1k_tokens"] = {label: round(s / thousands, 3) for label, s in cpu.items()}
    return out


def run_modes(args: ServedArgs, modes: list[Mode]) -> list[dict[str, Any]]:
    rows = []
    for repeat in range(args.repeats):
        for n in args.clients:
            order = modes if repeat % 2 == 0 else modes[::-1]  # neither path always goes first
            for mode in order:
                out = measure(mode, n)
                rows.append({"repeat": repeat, "clients": n, "mode": mode.name, **out})
                print(f"repeat {repeat} clients {n:>2} {mode.name:>6}: {out['tok_per_s']:.1f} tok/s, "
                      f"TTFT p50 {out['ttft_p50_s']:.3f} s, CPU s/1k tok {out['cpu_s_per_1k_tokens']}", flush=True)
    return rows


def summary(rows: list[dict[str, Any]], modes: list[str], clients: list[int]) -> list[dict[str, Any]]:
    """Each (clients, mode): its median run by tokens/s; ratios against ``inproc``."""
    out = []
    for n in clients:
        medians = {}
        for mode in modes:
            runs = sorted((r for r in rows if r["clients"] == n and r["mode"] == mode), key=lambda r: r["tok_per_s"])
            if runs:
                medians[mode] = runs[len(runs) // 2]
        base = medians.get("inproc")
        for mode, run in medians.items():
            out.append({"clients": n, "mode": mode, "tok_per_s": round(run["tok_per_s"], 2),
                        "ttft_p50_s": round(run["ttft_p50_s"], 3),
                        "x_inproc": round(run["tok_per_s"] / base["tok_per_s"], 3) if base else None,
                        "ttft_p50_all_s": round(statistics.median(
                            r["ttft_p50_s"] for r in rows if r["clients"] == n and r["mode"] == mode), 3),
                        "cpu_s_per_1k_tokens": run["cpu_s_per_1k_tokens"]})
    return out


def stack_modes(args: ServedArgs, stack_env: dict[str, str]):
    """A context manager yielding the ``v1`` mode over a fresh local stack."""
    import contextlib

    from core.model_source import model_id
    from core.workers import list_workers
    from tests.harness.stack import Stack, job_store, start_redis, wait_until

    @contextlib.contextmanager
    def started():
        redis_proc, url = start_redis(Path("/tmp"))
        stack = Stack(redis_url=url, env_overrides=stack_env)
        worker = stack.start_worker(pool="threads", concurrency=max(args.clients))
        web, base_url = stack.start_web()
        store = job_store(url)
        try:
            wait_until(lambda: any(w["info"].get("engine_loaded") for w in list_workers(store.client, 15)),
                       300, what="worker with a loaded model")
            wait_until(lambda: _up(base_url), 60, what="web server")
            client = openai_client(base_url, model_id(args.model), args.new_tokens)
            processes = {"web": web.popen.pid, "worker": worker.popen.pid, "redis": redis_proc.popen.pid}
            yield Mode("v1", lambda n: run_clients(n, args.rounds, client), processes)
        finally:
            for proc in (web, worker, redis_proc):
                proc.stop()
    return started()


def _up(base_url: str) -> bool:
    try:
        return requests.get(f"{base_url}/healthz", timeout=2).status_code == 200
    except requests.RequestException:
        return False


def main(args: ServedArgs) -> None:
    import contextlib

    import torch

    from core.settings import load_settings
    from engine.engine import Engine

    biggest = max(args.clients)
    sizes = {"MINISERVE_MAX_BATCH": str(biggest), "MINISERVE_MAX_BATCHED_TOKENS": str(max(512, 64 * biggest))}
    env = {"MINISERVE_MODEL": args.model, "MINISERVE_THREADS": str(args.threads), "MINISERVE_LOG_LEVEL": "WARNING",
           "MINISERVE_JSON_LOGS": "true", "MINISERVE_RATE_LIMIT_PER_MINUTE": "0", **sizes}
    torch.set_num_threads(args.threads)
    engine = Engine(load_settings(model=args.model, threads=args.threads, max_batch=biggest,
                                  max_batched_tokens=max(512, 64 * biggest))).load()
    inproc = Mode("inproc", lambda n: run_clients(n, args.rounds, inproc_client(engine.loop, args.new_tokens)))
    with contextlib.ExitStack() as stack:
        v1 = stack.enter_context(stack_modes(args, env))
        modes = [inproc, v1]
        if args.llama_server:
            from bench.llama_served import llama_mode

            modes.append(stack.enter_context(llama_mode(args.llama_server, args.threads, args.rounds,
                                                        args.new_tokens)))
        for mode in modes:  # warm every path once at the largest concurrency (pool, kernels, caches)
            if mode.prepare is not None:
                mode.prepare(biggest)
            mode.run(biggest)
        rows = run_modes(args, modes)
    engine.loop.close()
    report(args, rows, summary(rows, [m.name for m in modes], args.clients))


def report(args: ServedArgs, rows: list[dict[str, Any]], table: list[dict[str, Any]]) -> None:
    print_table([{k: v for k, v in t.items() if k != "cpu_s_per_1k_tokens"} for t in table])
    out = Path(args.output)
    write_csv(out, [{**{k: v for k, v in r.items() if k != "cpu_s_per_1k_tokens"},
                     **{f"cpu_{k}": v for k, v in r["cpu_s_per_1k_tokens"].items()}} for r in rows])
    write_json(out.with_suffix(".json"), {"args": asdict(args), "machine": machine_info(), "summary": table})
    plot(table, out.with_suffix(".png"))
    print(f"wrote {out}, {out.with_suffix('.json')}, {out.with_suffix('.png')}")


def plot(table: list[dict[str, Any]], path: Path) -> None:
    plt = pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
    for mode in dict.fromkeys(t["mode"] for t in table):
        points = [t for t in table if t["mode"] == mode]
        axes[0].plot([t["clients"] for t in points], [t["tok_per_s"] for t in points], marker="o", label=mode)
        axes[1].plot([t["clients"] for t in points], [t["ttft_p50_s"] for t in points], marker="o", label=mode)
    axes[0].set_title("aggregate tokens/s")
    axes[1].set_title("TTFT p50 (s)")
    for ax in axes:
        ax.set_xlabel("concurrent streaming clients")
        ax.legend()
    fig.suptitle("Through /v1 (web -> Redis -> worker), the in-process batched engine, and llama-server where run")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
