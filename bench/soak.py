"""Soak: many clients for minutes, some hostile, with a worker SIGKILL and a Redis outage
longer than the lease; nothing may be lost, finish twice, run twice at once, or answer 500.

    python -m bench.soak [--minutes 10] [--clients 50] [--hostile 0.1] [--lease-s 10]
                         [--outage-s 30] [--workers 2] [--concurrency 8]

Starts its own redis-server (append-only file on, so it can restart without losing jobs),
Celery workers (threads pool, the default) and web server on free ports, with the tiny
random-weight test model (the soak measures the service, not the model). Each client loops
until the time is up: 90% submit a generation job (``POST /jobs``) and follow its SSE
stream to the end, reconnecting with ``Last-Event-ID`` (as ``EventSource`` does) when the
stream breaks; 10% are hostile: bad bodies (deep JSON, wrong types, unknown fields), a
1 MB agent prompt, an out-of-range ``Last-Event-ID``, a job cancelled at a random moment, or
one of the shared-service probe's (:mod:`bench.soak_hostile`: a prompt past the context, a
``/v1`` stream through the faults, a Batch API file with a line over the cap, a file flood
against the per-key quota).
Submissions that meet a 503 (Redis down) are retried with the same ``Idempotency-Key``.

Faults: at 30% of the run worker 0 gets SIGKILL (main process and pool) and is started again
10 s later; at 55% Redis stops for ``--outage-s`` (longer than the lease) and comes back.

    python -m bench.soak --memory [--jobs 100] [--max-tokens 16]

is the memory mode instead (:mod:`bench.soak_memory`): one worker with the default model and
settings, its resident memory after start, after 100 mixed jobs and after an ``official``
job (``results/soak_memory.json``).

    python -m bench.soak --worker-death [--reps 3] [--tokens 300] [--kill-after 40]

is the worker-death mode (:mod:`bench.worker_death`): a worker SIGKILLed mid-stream, the
client's largest gap and whether its text is the stored answer (``results/worker_death.json``).

Reported (``results/soak.json`` + ``.png``): jobs accepted / ended by state; *lost* (accepted,
but not ended when the run drained, or gone from Redis); *duplicated terminal events* (a
stream with more than one, or a client that saw a seq twice); responses by status class,
500s and 503s apart (503 ``redis_unavailable`` is the documented answer while Redis is down);
*concurrent attempts* (two attempts of one job running at the same time, from the workers'
``job_started`` / ``job_finished`` log events; an attempt on the killed worker ends at the kill).
"""
from __future__ import annotations

import argparse
import concurrent.futures as futures
import functools
import random
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import redis
import requests

from bench import soak_hostile, soak_memory, worker_death
from bench.local_stack import tiny_model
from bench.soak_report import attempt_intervals, check_jobs, concurrent_attempts, plot, summarize
from bench.stats import cpu_model, machine_info, write_json
from core.events import TERMINAL_EVENTS
from core.jobs import JobStore
from core.workers import list_workers
from tests.harness.client import iter_sse
from tests.harness.stack import Process, Stack, free_port, start_redis, wait_until

TERMINAL = set(TERMINAL_EVENTS)
DEEP = '{"prompt": ' + "[" * 1000 + "]" * 1000 + "}"


@dataclass
class Tally:
    """Everything the clients saw, shared by their threads."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    statuses: Counter = field(default_factory=Counter)
    by_kind: Counter = field(default_factory=Counter)
    accepted: dict[str, str] = field(default_factory=dict)  # job id -> kind
    seen_terminal: Counter = field(default_factory=Counter)  # job id -> terminal events the client saw
    repeated_seqs: int = 0
    client_errors: Counter = field(default_factory=Counter)
    timeline: list[tuple[float, str]] = field(default_factory=list)  # (t, event)
    unexpected: list[str] = field(default_factory=list)
    batches: list[str] = field(default_factory=list)  # Batch API batches started (bench.soak_hostile)

    def status(self, code: int, t: float) -> None:
        with self.lock:
            self.statuses[code] += 1
            if code >= 500:
                self.timeline.append((t, f"http_{code}"))


@dataclass
class Soak:
    args: argparse.Namespace
    base: str
    t0: float
    hard_end: float  # monotonic: clients stop following streams after this (lost jobs show then)
    tally: Tally = field(default_factory=Tally)

    def now(self) -> float:
        return time.monotonic() - self.t0

    # ---- one client ------------------------------------------------------------------------
    def client(self, index: int, deadline: float) -> None:
        rng = random.Random(index)
        http = requests.Session()
        n = 0
        while time.monotonic() < deadline:
            n += 1
            kind = self.pick(rng)
            with self.tally.lock:
                self.tally.by_kind[kind] += 1
            try:
                self.action(kind)(http, rng, f"c{index}-{n}")
            except Exception as exc:  # noqa: BLE001 - a client's failure is a result, not a crash
                with self.tally.lock:
                    self.tally.client_errors[f"{kind}:{type(exc).__name__}"] += 1

    def pick(self, rng: random.Random) -> str:
        if rng.random() >= self.args.hostile:
            return "generate"
        return rng.choice(["bad_body", "huge_prompt", "bad_event_id", "cancel", *soak_hostile.KINDS])

    def action(self, kind: str):
        """This client's ``do_<kind>``: a method here, or one of bench.soak_hostile's."""
        own = getattr(self, f"do_{kind}", None)
        return own if own is not None else functools.partial(getattr(soak_hostile, f"do_{kind}"), self)

    def request(self, http: requests.Session, method: str, path: str, **kwargs) -> requests.Response:
        reply = http.request(method, f"{self.base}{path}", timeout=60, **kwargs)
        self.tally.status(reply.status_code, self.now())
        return reply

    def submit(self, http: requests.Session, body: dict, key: str) -> str | None:
        """POST /jobs; a 503 (Redis down) is retried with the same Idempotency-Key."""
        for _ in range(60):
            reply = self.request(http, "POST", "/jobs", json=body, headers={"Idempotency-Key": key})
            if reply.status_code == 202:
                job_id = reply.json()["id"]
                with self.tally.lock:
                    self.tally.accepted.setdefault(job_id, body.get("type", "generate"))
                return job_id
            if reply.status_code != 503:
                self.tally.unexpected.append(f"submit {reply.status_code}: {reply.text[:120]}")
                return None
            time.sleep(min(5.0, float(reply.headers.get("Retry-After", 1))))
        return None

    def follow(self, http: requests.Session, job_id: str, cancel_after: float | None = None) -> None:
        """SSE to the terminal event, reconnecting with Last-Event-ID (as EventSource does)."""
        last, seqs, ends = 0, set(), self.hard_end
        canceller = None
        if cancel_after is not None:
            canceller = threading.Timer(cancel_after, self.cancel, args=(job_id,))
            canceller.start()
        try:
            while time.monotonic() < ends:
                try:
                    if self.read_stream(http, job_id, last, seqs):
                        return
                    last = max(seqs, default=0)
                except requests.RequestException:
                    last = max(seqs, default=0)
                time.sleep(1.0)
            self.tally.unexpected.append(f"follow timed out: {job_id}")
        finally:
            if canceller is not None:
                canceller.cancel()

    def read_stream(self, http: requests.Session, job_id: str, last: int, seqs: set[int]) -> bool:
        headers = {"Last-Event-ID": str(last)} if last else {}
        with http.get(f"{self.base}/jobs/{job_id}/events", stream=True, timeout=60, headers=headers) as reply:
            self.tally.status(reply.status_code, self.now())
            if reply.status_code != 200:
                return False
            for event in iter_sse(reply):
                if event.id in seqs:
                    with self.tally.lock:
                        self.tally.repeated_seqs += 1
                seqs.add(event.id)
                if event.type in TERMINAL:
                    with self.tally.lock:
                        self.tally.seen_terminal[job_id] += 1
                    return True
        return False

    def cancel(self, job_id: str) -> None:
        try:
            self.request(requests.Session(), "POST", f"/jobs/{job_id}/cancel")
        except requests.RequestException:
            pass

    # ---- what clients do -----------------------------------------------------------------
    def body(self, rng: random.Random, name: str) -> dict:
        return {"prompt": f"Client {name}: say something about queues.", "max_new_tokens": self.args.max_new_tokens,
                "generation_method": "paged", "stop": ["zzz"] if rng.random() < 0.2 else None}

    def do_generate(self, http: requests.Session, rng: random.Random, name: str) -> None:
        job_id = self.submit(http, self.body(rng, name), uuid.uuid4().hex)
        if job_id:
            self.follow(http, job_id)

    def do_cancel(self, http: requests.Session, rng: random.Random, name: str) -> None:
        body = {**self.body(rng, name), "max_new_tokens": self.args.max_new_tokens * 4}
        job_id = self.submit(http, body, uuid.uuid4().hex)
        if job_id:
            self.follow(http, job_id, cancel_after=rng.uniform(0.0, 1.0))

    def do_bad_body(self, http: requests.Session, rng: random.Random, name: str) -> None:
        bodies = [DEEP, '{"prompt": 5}', '{"prompt": "x", "max_tokens": 3}', '{"prompt": "x", "temperature": -1}',
                  "not json", '{"messages": [{"role": "robot", "content": "x"}]}']
        self.expect_4xx(self.request(http, "POST", "/jobs", data=rng.choice(bodies),
                                     headers={"Content-Type": "application/json"}))

    def do_huge_prompt(self, http: requests.Session, rng: random.Random, name: str) -> None:
        text = rng.choice("-(1 ") * 1_000_000
        path, body = rng.choice([("/jobs", {"type": "agent", "prompt": text}), ("/agent/run", {"prompt": text}),
                                 ("/jobs", {"prompt": text})])
        self.expect_4xx(self.request(http, "POST", path, json=body))

    def do_bad_event_id(self, http: requests.Session, rng: random.Random, name: str) -> None:
        with self.tally.lock:
            known = list(self.tally.accepted)[-50:]
        if not known:
            return
        reply = self.request(http, "GET", f"/jobs/{rng.choice(known)}/events",
                             headers={"Last-Event-ID": str(2**64 + rng.randrange(1000))})
        self.expect_4xx(reply)

    def expect_4xx(self, reply: requests.Response) -> None:
        if not 400 <= reply.status_code < 500 and reply.status_code != 503:
            self.tally.unexpected.append(f"hostile request got {reply.status_code}: {reply.text[:120]}")


# ---- the stack and its faults ---------------------------------------------------------------
@dataclass
class SoakStack:
    stack: Stack
    redis_dir: Path
    redis_port: int
    redis: Process | None = None
    workers: list[Process] = field(default_factory=list)
    web: Process | None = None
    killed_at: float | None = None  # wall clock of the worker SIGKILL

    def start_redis(self) -> None:
        self.redis, _ = start_redis(self.redis_dir, port=self.redis_port, appendonly=True)

    def stop_all(self) -> None:
        for proc in [self.web, *self.workers, self.redis]:
            if proc is not None:
                proc.stop()


def start_stack(args, folder: Path) -> tuple[SoakStack, str, JobStore]:
    port = free_port()
    env = {"MINISERVE_MODEL": tiny_model(folder / "tiny-model"), "MINISERVE_DEVICE": "cpu", "MINISERVE_DTYPE": "float32",
           "MINISERVE_THREADS": "1", "MINISERVE_LOG_LEVEL": "INFO", "MINISERVE_JSON_LOGS": "true",
           "MINISERVE_MAX_QUEUE_DEPTH": "100000", "MINISERVE_WEB_WORKERS": "2",
           "MINISERVE_MAX_BATCH": str(args.concurrency), "MINISERVE_LEASE_S": str(args.lease_s),
           "MINISERVE_MAX_BODY_BYTES": "2000000", "MINISERVE_MAX_FILES_PER_KEY": str(args.flood_files - 5)}
    soak = SoakStack(Stack(redis_url=f"redis://127.0.0.1:{port}/0", env_overrides=env, log_dir=folder),
                     folder / "redis", port)
    soak.redis_dir.mkdir()
    soak.start_redis()
    soak.workers = [start_worker(soak, i) for i in range(args.workers)]
    soak.web, base = soak.stack.start_web()
    store = JobStore(redis.Redis.from_url(soak.stack.redis_url, decode_responses=True))
    wait_until(lambda: sum(bool(w["info"].get("engine_loaded")) for w in list_workers(store.client, 30))
               >= args.workers, 300, what="workers with a loaded model")
    wait_until(lambda: _up(base), 60, what="web server")
    return soak, base, store


def start_worker(soak: SoakStack, index: int, generation: int = 0) -> Process:
    return soak.stack.start_worker(name=f"soak{index}g{generation}", pool="threads",
                                   concurrency=int(soak.stack.env_overrides["MINISERVE_MAX_BATCH"]))


def _up(base: str) -> bool:
    try:
        return requests.get(f"{base}/healthz", timeout=2).status_code == 200
    except requests.RequestException:
        return False


def faults(args, soak: SoakStack, t0: float, events: list[tuple[float, str]], stop: threading.Event) -> None:
    """Worker 0 SIGKILLed at 30% (restarted 10 s later); Redis down at 55% for ``outage_s``."""
    total = args.minutes * 60
    plan = [(0.30 * total, "kill"), (0.30 * total + 10, "restart_worker"), (0.55 * total, "redis_down"),
            (0.55 * total + args.outage_s, "redis_up")]
    for at, what in plan:
        if stop.wait(max(0.0, at - (time.monotonic() - t0))):
            return
        if what == "kill":
            soak.killed_at = time.time()
            soak.workers[0].kill()
        elif what == "restart_worker":
            soak.workers.append(start_worker(soak, 0, generation=1))
        elif what == "redis_down":
            soak.redis.stop()
        else:
            soak.start_redis()
        events.append((time.monotonic() - t0, what))
        print(f"[{time.monotonic() - t0:6.1f}s] fault: {what}", flush=True)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", type=float, default=10)
    parser.add_argument("--clients", type=int, default=50)
    parser.add_argument("--hostile", type=float, default=0.1, help="share of hostile requests")
    parser.add_argument("--lease-s", type=int, default=10)
    parser.add_argument("--outage-s", type=float, default=30)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=16)
    parser.add_argument("--flood-files", type=int, default=25, help="uploads a file-flood client tries (quota: 5 fewer)")
    parser.add_argument("--output", default="results/soak")
    soak_memory.add_arguments(parser)
    worker_death.add_arguments(parser)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.memory:
        return soak_memory.main(args)
    if args.worker_death:
        return worker_death.main(args, argv if argv is not None else sys.argv[1:])
    folder = Path(tempfile.mkdtemp(prefix="miniserve-soak-"))
    soak_stack, base, store = start_stack(args, folder)
    stop, faults_done = threading.Event(), []
    try:
        t0, wall_t0 = time.monotonic(), time.time()
        deadline = t0 + args.minutes * 60
        soak = Soak(args, base, t0, hard_end=deadline + 240)
        threading.Thread(target=faults, args=(args, soak_stack, t0, faults_done, stop), daemon=True).start()
        with futures.ThreadPoolExecutor(args.clients) as pool:
            list(pool.map(lambda i: soak.client(i, deadline), range(args.clients)))
        seconds = time.monotonic() - t0
        stop.set()
        wait_until(lambda: _up(base), 60, what="web after the run")
        jobs = check_jobs(store, soak.tally)
        jobs["open_batches"] = soak_hostile.batches_ended(base, soak.tally.batches)
        logs = sorted(folder.glob("worker-*.log"))
        killed_log = folder / f"{soak_stack.workers[0].name}.log"
        runs = attempt_intervals(logs, killed_log, soak_stack.killed_at, time.time())
        overlaps = concurrent_attempts(runs)
        ends = sorted(max(span[1] for span in spans) - wall_t0 for spans in runs.values() if spans)
    finally:
        stop.set()
        soak_stack.stop_all()
    summary = summarize(args, soak.tally, jobs, overlaps, seconds, faults_done)
    summary["machine"] = machine_info()
    summary["cpu"] = cpu_model()
    summary["command"] = "python -m bench.soak " + " ".join(argv if argv is not None else sys.argv[1:])
    summary["logs"] = str(folder)
    out = Path(args.output)
    write_json(out.with_suffix(".json"), summary)
    plot(soak.tally, summary, ends, out.with_suffix(".png"))
    for key in ("accepted_jobs", "job_states", "lost", "batches_started", "batches_not_ended", "duplicated_terminal_events", "repeated_sse_seqs", "re_run",
                "concurrent_attempts", "http_500", "http_503", "http_5xx_outside_outage", "responses_by_class", "unexpected", "client_errors"):
        print(f"{key:>28}: {summary[key]}")
    print(f"wrote {out.with_suffix('.json')}, {out.with_suffix('.png')} (process logs in {folder})")
    return 0 if not (summary["lost"] or summary["duplicated_terminal_events"] or summary["concurrent_attempts"]
                     or summary["batches_not_ended"] or summary["unexpected"]
                     or summary["http_500"] or summary["http_5xx_outside_outage"]) else 1


if __name__ == "__main__":
    raise SystemExit(main())
