"""``python -m bench.load --connections N --slowloris M``: the web holding thousands of streams.

Starts redis-server and ``python -m web`` (no Celery worker: a fake worker thread here runs
jobs straight in the job store, so the benchmark measures the web and not a model). Then:

1. *unloaded*: ``GET /health`` latency (readiness: the fake worker heartbeats as loaded),
   and the time from ``POST /jobs`` to the first token event on the job's SSE stream
   (TTFT), with nothing else connected;
2. *loaded*: N SSE subscribers held open on running jobs (each emits a token event every
   ``token_every_s``), N/10 more cycling over finished jobs (replay to the end, wait
   ``cycle_pause_s``, reconnect), and M slowloris sockets (half drip their headers, half
   a body); the same two probes run meanwhile;
3. the running jobs finish; every held subscriber must have seen every event of its job
   exactly once and the terminal event (*lost* counts those that did not), every cycling
   stream its terminal event.

Writes ``<output>.json`` (summary, setup, machine), ``<output>.csv`` (one row per probe)
and ``<output>.png``. Targets: ``/health`` p99 under 100 ms loaded, loaded TTFT p50 within
2x unloaded, nothing lost.
"""
from __future__ import annotations

import multiprocessing as mp
import os
import tempfile
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import requests

from bench.connection_clients import raise_fd_limit, run_clients
from bench.stats import machine_info, percentile, pyplot, write_csv, write_json
from core.jobs import JobStore
from core.keys import JOBS_INDEX
from core.workers import write_heartbeat
from tests.harness.stack import Process, Stack, job_store, start_redis, wait_until

FINISHED_EVENTS = 20  # token events of each finished job
HEARTBEAT_S = 5
WEB_BOOT_S = 180  # seen over 60 s at a load average of 16 on 2 cores
HEALTH_PATH = "/health"  # readiness: Redis, and a worker with its model loaded (the fake one)
# The web's clocks for this run: slowloris sockets must be cut several times within it.
WEB_CLOCKS = {"MINISERVE_HEADER_TIMEOUT_S": "5", "MINISERVE_BODY_TIMEOUT_S": "10",
              "MINISERVE_BODY_DEADLINE_S": "10", "MINISERVE_SSE_KEEPALIVE_S": "5"}


@dataclass
class Probe:
    phase: str  # unloaded | loaded
    kind: str  # health | ttft
    at_s: float
    ms: float
    status: int


class FakeWorker:
    """Runs jobs in the store as a worker would: ``running`` jobs tick a token every
    ``every_s`` until :meth:`finish_running`; jobs the web queues get their first token at
    once and end after three (the TTFT probes)."""

    def __init__(self, store: JobStore, every_s: float) -> None:
        self.store, self.every_s = store, every_s
        self.running: dict[str, int] = {}  # job id -> attempt
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self._tick, daemon=True),
                        threading.Thread(target=self._serve_queued, daemon=True)]

    def start_running(self, count: int) -> list[str]:
        for _ in range(count):
            job = self.store.create("generation", "generation", {"prompt": "bench"})
            self.running[job.id] = self.store.start_attempt(job.id, "bench-fake", lease_s=3600).attempt
        self.heartbeat()
        for thread in self.threads:
            thread.start()
        return list(self.running)

    def finished(self, count: int) -> list[str]:
        ids = []
        for _ in range(count):
            job = self.store.create("generation", "generation", {"prompt": "bench"})
            self._run(job.id, FINISHED_EVENTS)
            ids.append(job.id)
        return ids

    def _run(self, job_id: str, tokens: int) -> None:
        attempt = self.store.start_attempt(job_id, "bench-fake", lease_s=60).attempt
        for i in range(tokens):
            self.store.append_event(job_id, attempt, "token", {"text": f"t{i}"})
        self._finish(job_id, attempt, tokens)

    def _finish(self, job_id: str, attempt: int, tokens: int) -> None:
        self.store.finish(job_id, "succeeded", {"text": "", "finish_reason": "length", "method": "paged",
                                                "usage": {"prompt_tokens": 1, "completion_tokens": tokens}},
                          attempt=attempt)

    def _tick(self) -> None:
        beat = 0.0
        while not self.stop.wait(self.every_s):
            for job_id, attempt in list(self.running.items()):
                self.store.append_event(job_id, attempt, "token", {"text": "x"})
            if time.monotonic() - beat > HEARTBEAT_S:
                beat = time.monotonic()
                self.heartbeat()

    def heartbeat(self) -> None:
        """What a worker with its model loaded reports, so ``/health`` answers 200."""
        write_heartbeat(self.store.client, "bench-fake", {"engine_loaded": True, "model": "tiny"})

    def _serve_queued(self) -> None:
        """Runs each job created after the start (the web's TTFT probes). It asks the job
        index for ids newer than the last it saw: one cheap ``ZRANGEBYSCORE`` per tick, where
        listing the recent jobs and parsing each (``JobStore.list``) every 5 ms kept a core
        of this process busy and Redis answering thousands of ``HGETALL`` a second."""
        since = time.time()
        while not self.stop.wait(0.005):
            fresh = self.store.client.zrangebyscore(JOBS_INDEX, f"({since!r}", "+inf", withscores=True)
            for job_id, created_at in fresh:
                since = max(since, created_at)
                if job_id not in self.running:
                    self._run(job_id, 3)

    def finish_running(self) -> dict[str, int]:
        """Ends every running job; returns each one's last seq (its terminal event's)."""
        self.stop.set()
        for thread in self.threads:
            thread.join(10)
        for job_id, attempt in self.running.items():
            self._finish(job_id, attempt, 0)
        return {job_id: self.store.get(job_id).last_seq for job_id in self.running}


def health_ms(base: str, path: str = HEALTH_PATH) -> tuple[float, int]:
    started = time.perf_counter()
    try:
        status = requests.get(f"{base}{path}", timeout=30).status_code
    except requests.RequestException:
        status = 0
    return (time.perf_counter() - started) * 1000, status


def ttft_ms(base: str) -> tuple[float, int]:
    """POST /jobs, then follow its SSE stream to the first token event."""
    started = time.perf_counter()
    try:
        answer = requests.post(f"{base}/jobs", json={"prompt": "hi", "max_new_tokens": 3}, timeout=30)
        if answer.status_code != 202:
            return float("nan"), answer.status_code
        with requests.get(f"{base}{answer.json()['links']['events']}", stream=True, timeout=30) as events:
            for line in events.iter_lines():
                if line == b"event: token":
                    return (time.perf_counter() - started) * 1000, events.status_code
    except requests.RequestException:
        pass
    return float("nan"), 0


PROBES = {"health": (health_ms, 0.05), "ttft": (ttft_ms, 1.0)}  # kind -> (probe, pause between two)


def probe_loop(base: str, kind: str, phase: str, seconds: float, t0: float, out: Any) -> None:
    """Child-process entry: one kind of probe, one after another with its pause, for
    ``seconds``; the rows go back through ``out``. ``t0`` is a ``time.monotonic()`` of the
    parent (the clock is the system's, so the processes share it)."""
    call, pause_s = PROBES[kind]
    rows, end = [], time.monotonic() + seconds
    while time.monotonic() < end:
        ms, status = call(base)
        rows.append(Probe(phase, kind, round(time.monotonic() - t0, 3), round(ms, 2), status))
        time.sleep(pause_s)
    out.send(rows)


def probe(base: str, phase: str, seconds: float, t0: float) -> list[Probe]:
    """``/health`` every 50 ms and a TTFT probe every second, for ``seconds``, each kind in
    a process of its own: the figures are what a separate client sees, with nothing of this
    process (the fake worker's threads, the GIL) between it and the server. Measured with
    the probes in this process beside the fake worker, a loaded phase of 40 s got two
    ``/health`` answers."""
    ctx = mp.get_context("spawn")
    started = []
    for kind in PROBES:
        receive, send = ctx.Pipe(duplex=False)
        proc = ctx.Process(target=probe_loop, args=(base, kind, phase, seconds, t0, send), daemon=True)
        proc.start()
        started.append((proc, receive))
    rows: list[Probe] = []
    for proc, receive in started:
        rows += receive.recv() if receive.poll(seconds + 120) else []
        proc.join(10)
    return sorted(rows, key=lambda r: r.at_s)


@dataclass
class ConnectionRun:
    """What one run is asked to do (``bench.load`` flags, or a test's smaller numbers)."""

    connections: int = 2000
    slowloris: int = 200
    running_jobs: int = 20
    token_every_s: float = 1.0
    loaded_s: float = 40.0  # past the body deadline, so body drippers are cut at least once
    unloaded_s: float = 8.0
    web_workers: int = 2
    cycle_pause_s: float = 10.0  # a finished job's subscriber waits this long before it reconnects
    output: str = "results/connections"

    @property
    def cycling(self) -> int:
        return max(1, self.connections // 10)


def start_web(run: ConnectionRun, folder: Path) -> tuple[list[Process], str, JobStore]:
    from bench.local_stack import tiny_model

    redis_proc, url = start_redis(folder)
    limit = run.connections + run.cycling + 100  # every client here is 127.0.0.1
    env = {"MINISERVE_MODEL": tiny_model(folder / "tiny-model"), "MINISERVE_LOG_LEVEL": "WARNING",
           "MINISERVE_WEB_WORKERS": str(run.web_workers), **WEB_CLOCKS,
           "MINISERVE_MAX_STREAMS_PER_CLIENT": str(limit), "MINISERVE_MAX_QUEUE_DEPTH": "0",
           "MINISERVE_RATE_LIMIT_PER_MINUTE": "0", "MINISERVE_API_KEYS": ""}
    web, base = Stack(redis_url=url, env_overrides=env, log_dir=folder).start_web()
    try:
        wait_until(lambda: health_ms(base, "/healthz")[1] == 200, WEB_BOOT_S, what="web server")
    except BaseException:  # a web that does not come up is not left running, nor its Redis
        web.stop()
        redis_proc.stop()
        raise
    return [redis_proc, web], base, job_store(url)


def web_cpu_s(web: Process) -> tuple[float, float]:
    """(CPU seconds the web's gunicorn processes have run, seconds they have waited runnable
    for a CPU), summed over their threads (``/proc/<pid>/task/*/schedstat``). The wait says
    whether the web was slow or the machine was busy: measured at 1,000 streams beside a
    load average of 16, the web ran 0.19 CPU-s/s and waited 1.75 s/s (two processes
    runnable nearly all the time), so its latency was the machine's queue, not its own work."""
    ran = waited = 0.0
    for pid in [web.popen.pid, *_children(web.popen.pid)]:
        for task in Path(f"/proc/{pid}/task").glob("*"):
            try:
                run_ns, wait_ns, _ = (task / "schedstat").read_text().split()
            except (OSError, ValueError):
                continue
            ran, waited = ran + int(run_ns) / 1e9, waited + int(wait_ns) / 1e9
    return ran, waited


def _children(pid: int) -> list[int]:
    try:
        return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def hold_connections(run: ConnectionRun, port: int, held: list[str], finished: list[str]):
    """Starts the client process; returns it with its status array, stop event and pipe."""
    ctx = mp.get_context("spawn")
    status, stop = ctx.Array("i", 2), ctx.Event()
    receive, send = ctx.Pipe(duplex=False)
    targets = [held[i % len(held)] for i in range(run.connections)]
    cycle = [finished[i % len(finished)] for i in range(run.cycling)]
    proc = ctx.Process(target=run_clients, daemon=True,
                       args=(port, targets, cycle, run.slowloris, run.cycle_pause_s, status, stop, send))
    proc.start()
    return proc, status, stop, receive


def measure(run: ConnectionRun) -> dict[str, Any]:
    raise_fd_limit()
    folder = Path(tempfile.mkdtemp(prefix="miniserve-connections-"))
    procs, base, store = start_web(run, folder)
    worker = FakeWorker(store, run.token_every_s)
    try:
        finished = worker.finished(20)
        held = worker.start_running(run.running_jobs)
        t0 = time.monotonic()
        probe(base, "warmup", 2, t0)
        rows = probe(base, "unloaded", run.unloaded_s, t0)
        proc, status, stop, receive = hold_connections(run, int(base.rsplit(":", 1)[1]), held, finished)
        wait_until(lambda: status[0] >= run.connections, 300, interval_s=0.5, what="held streams open")
        opened_s = round(time.monotonic() - t0, 1)
        cpu_before, wall = web_cpu_s(procs[1]), time.perf_counter()
        rows += probe(base, "loaded", run.loaded_s, t0)
        peak = {"held": status[0], "all_streams": status[1]}
        machine = load_phase_machine(cpu_before, web_cpu_s(procs[1]), time.perf_counter() - wall)
        last_seq = worker.finish_running()
        stop.set()
        clients = receive.recv() if receive.poll(120) else {"subscribers": [], "slowloris": [], "connect_errors": -1}
        proc.join(30)
    finally:
        worker.stop.set()
        for proc_ in reversed(procs):
            proc_.stop()
    return summarize(run, rows, clients, last_seq, peak, opened_s) | {"load_phase_machine": machine}


def load_phase_machine(before: tuple[float, float], after: tuple[float, float], wall_s: float) -> dict[str, Any]:
    return {"web_cpu_s_per_s": round((after[0] - before[0]) / wall_s, 3),
            "web_runqueue_wait_s_per_s": round((after[1] - before[1]) / wall_s, 3),
            "load_average_1m": os.getloadavg()[0], "cpus": os.cpu_count()}


def _stats(rows: list[Probe], phase: str, kind: str) -> dict[str, float]:
    good = [r.ms for r in rows if r.phase == phase and r.kind == kind and r.status == 200]
    return {"n": len(good), "errors": sum(1 for r in rows if r.phase == phase and r.kind == kind and r.status != 200),
            "p50_ms": round(percentile(good, 50), 2), "p99_ms": round(percentile(good, 99), 2),
            "max_ms": round(max(good, default=float("nan")), 2)}


def _subscribers(clients: dict[str, Any], last_seq: dict[str, int]) -> dict[str, int]:
    held = [s for s in clients["subscribers"] if s["held"]]
    cycling = [s for s in clients["subscribers"] if not s["held"]]
    return {"held": len(held),
            "held_lost": sum(1 for s in held if s["seqs"] != list(range(1, last_seq[s["job_id"]] + 1))
                             or not s["terminal"]),
            "held_duplicated_events": sum(len(s["seqs"]) - len(set(s["seqs"])) for s in held),
            "held_not_200": sum(1 for s in held if s["status"] != 200),
            "cycling": len(cycling), "cycling_streams": sum(s["streams"] for s in cycling),
            "cycling_incomplete": sum(s["incomplete"] for s in cycling),
            "connect_errors": clients["connect_errors"]}


def _slowloris(clients: dict[str, Any]) -> dict[str, Any]:
    out = {}
    for body, name in ((False, "header_drip"), (True, "body_drip")):
        group = [s for s in clients["slowloris"] if s["body"] == body]
        lives = [t for s in group for t in s["lifetimes"]]
        answers = sorted({a for s in group for a in s["answers"]})
        out[name] = {"sockets": len(group), "dropped_by_server": len(lives),
                     "longest_held_s": round(max(lives, default=float("nan")), 1), "answers": answers}
    return out


def summarize(run: ConnectionRun, rows: list[Probe], clients: dict[str, Any], last_seq: dict[str, int],
              peak: dict[str, int], opened_s: float) -> dict[str, Any]:
    health = {phase: _stats(rows, phase, "health") for phase in ("unloaded", "loaded")}
    ttft = {phase: _stats(rows, phase, "ttft") for phase in ("unloaded", "loaded")}
    subs = _subscribers(clients, last_seq)
    ratio = ttft["loaded"]["p50_ms"] / ttft["unloaded"]["p50_ms"]
    targets = {"health_p99_under_100ms": health["loaded"]["p99_ms"] < 100,
               "ttft_within_2x_unloaded": ratio <= 2.0,
               "nothing_lost": subs["held_lost"] == 0 and subs["held_duplicated_events"] == 0
               and subs["cycling_incomplete"] == 0 and health["loaded"]["errors"] == 0}
    return {"setup": asdict(run) | {"cycling_subscribers": run.cycling, "web_env": WEB_CLOCKS},
            "peak_open": peak, "all_held_open_at_s": opened_s, "health": health, "ttft": ttft,
            "ttft_loaded_over_unloaded": round(ratio, 2), "subscribers": subs, "slowloris": _slowloris(clients),
            "targets": targets, "rows": [asdict(r) for r in rows]}


def report(summary: dict[str, Any]) -> None:
    out = Path(summary["setup"]["output"])
    out.parent.mkdir(parents=True, exist_ok=True)
    rows = summary.pop("rows")
    write_csv(out.with_suffix(".csv"), rows)
    write_json(out.with_suffix(".json"), {**summary, "machine": machine_info()})
    plot(rows, summary, out.with_suffix(".png"))
    for phase in ("unloaded", "loaded"):
        h, t = summary["health"][phase], summary["ttft"][phase]
        print(f"{phase:>8}: {HEALTH_PATH} p50 {h['p50_ms']} ms p99 {h['p99_ms']} ms ({h['n']} ok, {h['errors']} errors);"
              f" TTFT p50 {t['p50_ms']} ms ({t['n']} jobs)")
    print("peak open:", summary["peak_open"], "| subscribers:", summary["subscribers"])
    print("slowloris:", summary["slowloris"])
    print("machine while loaded:", summary["load_phase_machine"])
    print("targets:", summary["targets"])


def plot(rows: list[dict[str, Any]], summary: dict[str, Any], path: Path) -> None:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(9, 4.5))
    for kind, marker in (("health", "."), ("ttft", "x")):
        for phase, color in (("unloaded", "tab:blue"), ("loaded", "tab:red")):
            pts = [r for r in rows if r["kind"] == kind and r["phase"] == phase and r["status"] == 200]
            ax.scatter([r["at_s"] for r in pts], [r["ms"] for r in pts], s=8, marker=marker, color=color,
                       label=f"{kind} ({phase})")
    ax.axhline(100, color="gray", linestyle="--", linewidth=0.8, label="100 ms")
    ax.set_yscale("log")
    ax.set_xlabel("seconds since start")
    ax.set_ylabel("latency, ms")
    setup = summary["setup"]
    ax.set_title(f"/health and TTFT with {setup['connections']} held SSE streams + {setup['cycling_subscribers']} cycling"
                 f" + {setup['slowloris']} slowloris")
    ax.legend(fontsize=7, loc="upper left")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(run: ConnectionRun) -> None:
    report(measure(run))
