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

import concurrent.futures as futures
import json
import os
import statistics
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

import requests

from bench.stats import RESULTS, machine_info, p50, print_table, pyplot, write_csv, write_json

TOPICS = ["a KV cache", "paged attention", "continuous batching", "rotary position embeddings",
          "grouped-query attention", "the softmax function", "a hash table", "gradient descent",
          "a Bloom filter", "TCP slow start", "a B-tree", "the CAP theorem", "garbage collection",
          "a mutex", "Python's GIL", "copy-on-write", "a Merkle tree", "backpropagation",
          "dropout", "beam search", "a red-black tree", "TLS handshakes", "a ring buffer", "SIMD",
          "a trie", "Raft consensus", "an LSM tree", "a page table", "a skip list", "UTF-8",
          "a semaphore", "quicksort"]
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


@dataclass
class Outcome:
    """One request as its client saw it."""
    ttft_s: float
    tokens: int


def prompt(client: int, round_: int) -> str:
    return f"Explain {TOPICS[(client * 3 + round_) % len(TOPICS)]} in detail, step by step."


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

def run_clients(n: int, rounds: int, one: Callable[[int, int], Outcome]) -> dict[str, Any]:
    """``n`` clients at once, each ``rounds`` requests in a row; aggregate tokens/s and TTFTs."""
    def client(c: int) -> list[Outcome]:
        return [one(c, r) for r in range(rounds)]

    started = time.perf_counter()
    with futures.ThreadPoolExecutor(n) as pool:
        outcomes = [o for part in pool.map(client, range(n)) for o in part]
    wall = time.perf_counter() - started
    tokens = sum(o.tokens for o in outcomes)
    return {"wall_s": wall, "tokens": tokens, "tok_per_s": tokens / wall,
            "ttft_p50_s": p50([o.ttft_s for o in outcomes])}


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


def chat_body(model: str, client: int, round_: int, new_tokens: int) -> dict[str, Any]:
    return {"model": model, "messages": [{"role": "user", "content": prompt(client, round_)}],
            "max_tokens": new_tokens, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}}


def openai_client(base_url: str, model: str, new_tokens: int, extra: dict[str, Any] | None = None
                  ) -> Callable[[int, int], Outcome]:
    """A streaming OpenAI chat client (ours or llama-server's), a fresh connection per request.

    Not a kept-alive session: llama-server closes a reused connection between a client's rounds
    (``RemoteDisconnected``), and both servers must be asked the same way; a local TCP connect
    costs well under a millisecond beside a chat's tenths of a second."""
    def one(client: int, round_: int) -> Outcome:
        body = {**chat_body(model, client, round_, new_tokens), **(extra or {})}
        started = time.perf_counter()
        ttft, tokens, pieces = float("nan"), 0, 0
        with requests.post(f"{base_url}/v1/chat/completions", json=body, stream=True, timeout=600,
                           headers={"Connection": "close"}) as response:
            if response.status_code != 200:  # say which server refused what, not only the status
                raise RuntimeError(f"{base_url} answered {response.status_code}: {response.text[:300]}")
            for line in response.iter_lines(decode_unicode=True):
                if not line or not line.startswith("data:") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[5:])
                if "error" in chunk:
                    raise RuntimeError(f"stream error: {chunk['error']}")
                delta = (chunk.get("choices") or [{}])[0].get("delta") or {}
                if delta.get("content"):
                    pieces += 1
                    if ttft != ttft:
                        ttft = time.perf_counter() - started
                if chunk.get("usage"):
                    tokens = int(chunk["usage"]["completion_tokens"])
        return Outcome(ttft, tokens or pieces)  # a server without usage: one piece per token (llama-server)
    return one


# ---------------------------------------------------------------- the run

@dataclass
class Mode:
    """One path: how to run n clients, and the processes whose CPU it costs."""
    name: str
    run: Callable[[int], dict[str, Any]]
    processes: dict[str, int] = field(default_factory=dict)  # label -> root pid
    prepare: Callable[[int], None] | None = None  # made ready for n clients before it is timed


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
