"""The soak's memory mode (``python -m bench.soak --memory``): what one worker with the default
model and default settings holds, read from ``/proc`` at three points.

1. *started*: the model loaded, no job run yet;
2. *after N mixed jobs* (default 100, through the web, 8 clients at once, the worker's
   default threads pool): every method but ``official``, short and long prompts (a long one
   prefills in one big step), JSON-schema, choice and regex grammars, sampling with a seed,
   speculative decoding and jobs cancelled while they run;
3. *after an ``official`` job*: transformers' ``generate``, which under ``q8`` reloads the
   full-precision weights for its run (engine.quant.restore).

Each reading is ``VmRSS`` and its parts from ``/proc/<pid>/status``: ``RssAnon`` (the heap,
the model's tensors: private, only swap could take it) and ``RssFile`` (mapped files: the
libraries, the mapped embedding table; clean pages the kernel may drop and re-read, and
shared with other processes that map the same file), plus ``Pss`` from ``smaps_rollup`` (a
shared page counted once per sharer) and the largest file mappings by name. ``VmHWM`` is the
peak resident size so far; ``peak_sampled_mb`` the largest ``VmRSS`` sampled every 0.25 s
while the jobs ran. Writes ``results/soak_memory.json``; ``bench.report`` shows it.
"""
from __future__ import annotations

import argparse
import concurrent.futures as futures
import json
import random
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import requests

from bench.stats import cpu_model, machine_info, write_json
from core.events import TERMINAL_STATES
from core.workers import list_workers
from tests.harness.stack import Process, Stack, job_store, start_redis, wait_until

STATUS_FIELDS = ("VmRSS", "RssAnon", "RssFile", "RssShmem", "VmHWM")
LONG_TEXT = ("A queue decouples the producer of work from its consumer: the web accepts a job, "
             "Redis holds it, a worker takes it when it can. ") * 24
SCHEMA = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
          "required": ["name", "age"], "additionalProperties": False}


def read_memory(pid: int, top: int = 5) -> dict[str, Any]:
    """MB resident for ``pid``: the status fields, Pss, and the ``top`` file mappings by Rss."""
    out: dict[str, Any] = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in STATUS_FIELDS:
            out[f"{key}_mb"] = round(int(value.split()[0]) / 1024, 1)
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("Pss", "Pss_Anon", "Pss_File"):
            out[f"{key}_mb"] = round(int(value.split()[0]) / 1024, 1)
    out["file_mappings_mb"] = file_mappings(pid, top)
    return out


def file_mappings(pid: int, top: int) -> dict[str, float]:
    """The ``top`` mapped files by resident MB (``/proc/<pid>/smaps``), named by their file name."""
    sizes: dict[str, int] = {}
    name = None
    for line in Path(f"/proc/{pid}/smaps").read_text().splitlines():
        fields = line.split()
        if fields and "-" in fields[0] and not fields[0].endswith(":"):
            name = Path(fields[5]).name if len(fields) > 5 and fields[5].startswith("/") else None
        elif name and fields and fields[0] == "Rss:":
            sizes[name] = sizes.get(name, 0) + int(fields[1])
    ranked = sorted(sizes.items(), key=lambda item: -item[1])[:top]
    return {key: round(kb / 1024, 1) for key, kb in ranked}


def vm_rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


# ---- the jobs ------------------------------------------------------------------------------
KINDS = ("paged", "paged_long", "custom_cache", "prefix_cache", "no_cache", "json_schema", "choice", "regex",
         "sampled", "speculative", "cancel")


def job_body(kind: str, index: int, max_tokens: int) -> dict[str, Any]:
    """One job of ``kind``; ``index`` varies the prompt (so the prefix cache sees hits and misses)."""
    prompt = f"Question {index}: what does a queue do? Answer briefly."
    body: dict[str, Any] = {"prompt": prompt, "max_new_tokens": max_tokens, "generation_method": "paged"}
    if kind == "paged_long":
        body["prompt"] = f"{index}. {LONG_TEXT}Summarize that."
    elif kind in ("custom_cache", "no_cache"):
        body.update(generation_method=kind, max_new_tokens=max(4, max_tokens // 2))
    elif kind == "prefix_cache":
        body.update(generation_method=kind, prefix=LONG_TEXT[: 400 + 40 * (index % 3)])
    elif kind == "json_schema":
        body["response_format"] = {"type": "json_schema", "json_schema": {"name": "person", "schema": SCHEMA}}
        body["max_new_tokens"] = max_tokens * 2
    elif kind == "choice":
        body["guided_choice"] = ["yes", "no", "it depends"]
    elif kind == "regex":
        body["guided_regex"] = r"[0-9]{1,4}(\.[0-9]{1,2})?"
    elif kind == "sampled":
        body.update(temperature=0.8, top_p=0.9, top_k=40, seed=index)
    elif kind == "speculative":
        body.update(prompt=f"Repeat exactly: {LONG_TEXT[:300]}", speculative=True)
    elif kind == "cancel":
        body["max_new_tokens"] = max_tokens * 8
    return body


@dataclass
class JobRunner:
    """Submits jobs through the web and waits for each to end (polling ``GET /jobs/{id}``)."""

    base: str
    states: dict[str, int] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def run(self, kind: str, body: dict[str, Any], rng: random.Random) -> str:
        http = requests.Session()
        reply = http.post(f"{self.base}/jobs", json=body, timeout=60)
        if reply.status_code != 202:
            raise RuntimeError(f"{kind} job refused: {reply.status_code} {reply.text[:200]}")
        job_id = reply.json()["id"]
        cancel_at = time.monotonic() + rng.uniform(0.2, 1.5) if kind == "cancel" else None
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            state = http.get(f"{self.base}/jobs/{job_id}", timeout=30).json()["state"]
            if state in TERMINAL_STATES:
                with self.lock:
                    self.states[f"{kind}:{state}"] = self.states.get(f"{kind}:{state}", 0) + 1
                return state
            if cancel_at is not None and time.monotonic() >= cancel_at:
                http.post(f"{self.base}/jobs/{job_id}/cancel", timeout=30)
                cancel_at = None
            time.sleep(0.1)
        raise TimeoutError(f"{kind} job {job_id} did not end")


class Sampler:
    """The largest VmRSS of ``pid`` seen every ``interval_s`` while it runs."""

    def __init__(self, pid: int, interval_s: float = 0.25) -> None:
        self.pid, self.interval_s, self.peak = pid, interval_s, 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.peak = max(self.peak, vm_rss_mb(self.pid))

    def stop(self) -> float:
        self._stop.set()
        self._thread.join()
        return round(self.peak, 1)


# ---- the run -------------------------------------------------------------------------------
def start_stack(args, folder: Path) -> tuple[list[Process], str, dict[str, Any]]:
    """redis-server, one worker (default model and settings) and the web; the worker's heartbeat info."""
    redis_proc, url = start_redis(folder)
    stack = Stack(redis_url=url, env_overrides={"MINISERVE_JSON_LOGS": "true", "MINISERVE_LOG_LEVEL": "INFO",
                                                "MINISERVE_RATE_LIMIT_PER_MINUTE": "0",
                                                **({"MINISERVE_MODEL": args.model} if args.model else {}),
                                                **dict(item.split("=", 1) for item in args.worker_env)},
                  log_dir=folder)
    worker = stack.start_worker(name="memory", pool="threads", concurrency=8)
    web, base = stack.start_web()
    procs = [web, worker, redis_proc]
    try:
        return procs, base, wait_for_model(job_store(url), base)
    except BaseException:
        for proc in procs:
            proc.stop()
        raise


def wait_for_model(store, base: str, timeout_s: float = 3600) -> dict[str, Any]:
    """The loaded worker's heartbeat info (a first start quantizes the model: minutes on a busy CPU)."""
    loaded = lambda: [w for w in list_workers(store.client, 30) if w["info"].get("engine_loaded")]  # noqa: E731
    wait_until(lambda: bool(loaded()), timeout_s, interval_s=1.0, what="the worker's model")
    wait_until(lambda: _up(base), 60, what="web server")
    return loaded()[0]["info"]


def _up(base: str) -> bool:
    try:
        return requests.get(f"{base}/healthz", timeout=2).status_code == 200
    except requests.RequestException:
        return False


def reading(stage: str, pid: int, jobs: int, settle_s: float) -> dict[str, Any]:
    time.sleep(settle_s)  # idle: the loop's last turn done, freed memory handed back
    return {"stage": stage, "jobs": jobs, **read_memory(pid)}


def measure(args) -> dict[str, Any]:
    folder = Path(tempfile.mkdtemp(prefix="miniserve-soak-memory-"))
    procs, base, info = start_stack(args, folder)
    try:
        return measure_worker(args, base, info, procs[1].log_path) | {"logs": str(folder)}
    finally:
        for proc in procs:
            proc.stop()


def measure_worker(args, base: str, info: dict[str, Any], worker_log: Path) -> dict[str, Any]:
    """The three readings of the loaded worker ``info`` describes, jobs sent through ``base``."""
    pid, runner, rng = int(info["pid"]), JobRunner(base), random.Random(0)
    readings = [reading("started", pid, 0, args.settle_s)]
    sampler = Sampler(pid)
    kinds = [KINDS[i % len(KINDS)] for i in range(args.jobs)]
    rng.shuffle(kinds)
    started = time.monotonic()
    with futures.ThreadPoolExecutor(args.clients) as pool:
        list(pool.map(lambda item: runner.run(item[1], job_body(item[1], item[0], args.max_tokens),
                                              random.Random(item[0])), enumerate(kinds)))
    mixed_s = time.monotonic() - started
    peak = sampler.stop()
    readings.append({**reading(f"after {args.jobs} mixed jobs", pid, args.jobs, args.settle_s),
                     "peak_sampled_mb": peak})
    sampler = Sampler(pid)
    runner.run("official", {**job_body("paged", 0, args.max_tokens), "generation_method": "official"}, rng)
    peak = sampler.stop()
    readings.append({**reading("after an official job", pid, args.jobs + 1, args.settle_s),
                     "peak_sampled_mb": peak})
    official = log_events(worker_log, ("full_weights_restored", "full_weights_freed"))
    return {"official_reload": official, "model": info.get("model"), "quant": info.get("quant"), "dtype": info.get("dtype"),
            "pool": info.get("pool"), "concurrency": info.get("concurrency"), "clients": args.clients,
            "jobs": args.jobs, "max_tokens": args.max_tokens, "mixed_seconds": round(mixed_s, 1),
            "job_states": dict(sorted(runner.states.items())), "readings": readings,
            "target_mb": args.target_mb, "worker_env": args.worker_env}


def log_events(path: Path, names: tuple[str, ...]) -> list[dict[str, Any]]:
    """The worker log's JSON events of these names (the official job's reload and free)."""
    found = []
    for line in path.read_text(errors="replace").splitlines():
        if "{" in line and any(f'"{name}"' in line for name in names):
            try:
                event = json.loads(line[line.index("{"):])
            except ValueError:
                continue
            found.append({k: event.get(k) for k in ("event", "mb", "latency_ms", "tensors")})
    return found


def add_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("memory mode (--memory)")
    group.add_argument("--memory", action="store_true", help="measure one default worker's resident memory instead")
    group.add_argument("--jobs", type=int, default=100, help="mixed jobs before the second reading")
    group.add_argument("--max-tokens", type=int, default=16, help="max_new_tokens of a mixed job")
    group.add_argument("--memory-clients", dest="memory_clients", type=int, default=8)
    group.add_argument("--model", default="", help="MINISERVE_MODEL for the worker (default: the default model)")
    group.add_argument("--settle-s", type=float, default=3.0, help="idle seconds before each reading")
    group.add_argument("--worker-env", action="append", default=[], metavar="NAME=VALUE",
                       help="an extra environment variable for the processes (e.g. MALLOC_ARENA_MAX=2)")
    group.add_argument("--target-mb", type=float, default=1300.0, help="the VmRSS target after the mixed jobs")


def main(args) -> int:
    args.clients = args.memory_clients
    summary = measure(args)
    summary.update(machine=machine_info(), cpu=cpu_model(), command="python -m bench.soak --memory")
    out = Path(args.output).with_name(Path(args.output).name + "_memory.json")
    write_json(out, summary)
    for row in summary["readings"]:
        print(f"{row['stage']:>26}: VmRSS {row['VmRSS_mb']} MB (anon {row['RssAnon_mb']}, file {row['RssFile_mb']}), "
              f"Pss {row['Pss_mb']}, peak {row.get('peak_sampled_mb', '-')}")
    print(f"job states: {summary['job_states']}\nwrote {out} (process logs in {summary['logs']})")
    after = summary["readings"][1]["VmRSS_mb"]
    return 0 if after <= args.target_mb else 1
