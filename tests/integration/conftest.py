"""Real processes for the full path: a redis-server, Celery workers and the web server.

Everything runs on free local ports with a tiny random-weight model made by the tests, so
the suite needs no network and nothing running beforehand.
"""
from __future__ import annotations

import time
from pathlib import Path

import pytest
import redis

from core.events import TERMINAL_STATES
from core.jobs import JobRecord, JobStore
from core.tasks import QUEUE_FOR_JOB_TYPE, TASK_FOR_JOB_TYPE
from core.workers import list_workers
from tests.harness.stack import Stack, start_redis, wait_until
from tests.harness.step_gate import KEY as STEP_GATE_KEY
from tests.tiny_model import make_tiny_model_dir

WORKER_ENV = {
    "MINISERVE_DTYPE": "float32",
    "MINISERVE_DEVICE": "cpu",
    "MINISERVE_THREADS": "1",
    "MINISERVE_LEASE_S": "4",
    "MINISERVE_MAX_ATTEMPTS": "3",
    "MINISERVE_JSON_LOGS": "true",
    "MINISERVE_LOG_LEVEL": "INFO",
    "MINISERVE_TEST_STEP_GATE": STEP_GATE_KEY,  # open until a test closes it (tests/harness/step_gate.py)
}


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory) -> Path:
    return make_tiny_model_dir(tmp_path_factory.mktemp("tiny-model"), hidden_size=64, num_layers=2)


@pytest.fixture(scope="session")
def redis_proc(tmp_path_factory):
    proc, url = start_redis(tmp_path_factory.mktemp("redis"))
    yield proc, url
    proc.kill()


def _clean_stack(redis_proc, tiny_model) -> Stack:
    _, url = redis_proc
    redis.Redis.from_url(url).flushall()
    return Stack(redis_url=url, env_overrides={**WORKER_ENV, "MINISERVE_MODEL": str(tiny_model)})


@pytest.fixture
def stack(redis_proc, tiny_model) -> Stack:
    """A clean database and the environment every process of this test shares."""
    return _clean_stack(redis_proc, tiny_model)


@pytest.fixture(scope="module")
def shared_stack(redis_proc, tiny_model) -> Stack:
    """Like ``stack``, shared by a module whose tests don't harm the processes."""
    return _clean_stack(redis_proc, tiny_model)


def stack_store(stack: Stack) -> JobStore:
    """A job store on the stack's Redis, as the tests read it."""
    return JobStore(redis.Redis.from_url(stack.redis_url, decode_responses=True), ttl_s=3600)


@pytest.fixture
def store(stack) -> JobStore:
    return stack_store(stack)


@pytest.fixture
def celery_client(stack):
    from celery import Celery

    client = Celery("miniserve-test-client", broker=stack.redis_url)
    yield client
    client.close()


def wait_for_worker(store: JobStore, count: int = 1, timeout_s: float = 90, loaded: bool = True) -> list[dict]:
    def ready() -> bool:
        workers = list_workers(store.client, max_age_s=15)
        return len([w for w in workers if w["info"].get("engine_loaded") or not loaded]) >= count

    wait_until(ready, timeout_s, what=f"{count} worker(s) with a loaded engine")
    return list_workers(store.client, max_age_s=15)


def _started_worker(stack: Stack, store: JobStore, **kwargs):
    return _started_workers(stack, store, kwargs)[0]


def _started_workers(stack: Stack, store: JobStore, *specs: dict) -> list:
    """Start a worker per spec (start_worker's keywords), then wait until all are loaded: their
    loads overlap instead of each waiting for the one before."""
    return _loaded(store, [stack.start_worker(**spec) for spec in specs])


def started_workers_and_web(stack: Stack, store: JobStore, *specs: dict, **web_env: str):
    """Workers per spec and a web (``started_web``'s environment), the web booting while the
    workers load; returns (workers, web process, base url) once all are up."""
    procs = [stack.start_worker(**spec) for spec in specs]
    try:
        web_proc, base = started_web(stack, **web_env)
    except AssertionError:
        for proc in procs:
            proc.kill()
        raise
    try:
        return _loaded(store, procs), web_proc, base
    except AssertionError:
        web_proc.kill()
        raise


def _loaded(store: JobStore, procs: list) -> list:
    """``procs`` once their workers have loaded (killed, with their logs in the error, if not)."""
    try:
        wait_for_worker(store, count=len(procs))
    except TimeoutError:
        for proc in procs:
            proc.kill()
        raise AssertionError("worker(s) did not come up:\n" + "\n".join(proc.log()[-4000:] for proc in procs))
    return procs


@pytest.fixture
def worker(stack, store):
    proc = _started_worker(stack, store)
    yield proc
    proc.kill()  # teardown: no graceful stop is under test here


@pytest.fixture(scope="module")
def shared_store(shared_stack) -> JobStore:
    return stack_store(shared_stack)


@pytest.fixture(scope="module")
def shared_worker(shared_stack, shared_store):
    proc = _started_worker(shared_stack, shared_store)
    yield proc
    proc.kill()  # teardown: no graceful stop is under test here


def submit(store: JobStore, celery_client, request: dict, job_type: str = "generate") -> JobRecord:
    """Create a job and send its task by name, as the web does."""
    record = store.create(job_type, QUEUE_FOR_JOB_TYPE[job_type], request)
    celery_client.send_task(TASK_FOR_JOB_TYPE[job_type], args=[record.id, 0], task_id=record.id,
                            queue=record.queue)
    store.mark_dispatched(record.id)
    return record


def wait_terminal(store: JobStore, job_id: str, timeout_s: float = 60) -> JobRecord:
    wait_until(lambda: store.get(job_id).state in TERMINAL_STATES, timeout_s, what=f"job {job_id} to end")
    return store.get(job_id)


def wait_state(store: JobStore, job_id: str, state: str, timeout_s: float = 60) -> None:
    wait_until(lambda: store.get(job_id).state == state, timeout_s, what=f"job {job_id} to be {state}")


def gen_request(prompt: str = "Hello, how are you?", max_new_tokens: int = 24, **sampling) -> dict:
    return {"messages": [{"role": "user", "content": prompt}], "method": "official",
            "sampling": {"max_new_tokens": max_new_tokens, "temperature": 0.0, **sampling}}


def events_text(store: JobStore, job_id: str) -> str:
    """The text of a job's token events, in order (what a client following it read)."""
    return "".join(e.data["text"] for e in store.events(job_id) if e.type == "token")


def count_tokens_emitted(store: JobStore, job_id: str) -> int:
    return sum(1 for e in store.events(job_id) if e.type == "token")


def sleep_until_tokens(store: JobStore, job_id: str, n: int, timeout_s: float = 60) -> None:
    wait_until(lambda: count_tokens_emitted(store, job_id) >= n, timeout_s, interval_s=0.02,
               what=f"{n} tokens of {job_id}")
    time.sleep(0)


def started_web(stack: Stack, port: int | None = None, **env: str):
    """Start ``python -m web`` for ``stack`` (on ``port``, or a free one) and wait until it
    answers; returns (process, base url)."""
    import requests

    proc, base_url = stack.start_web(port, **env)

    def up() -> bool:
        try:
            return requests.get(f"{base_url}/healthz", timeout=1).status_code in (200, 503)
        except requests.RequestException:
            return False

    try:
        wait_until(up, 30, what="web server")
    except TimeoutError:
        proc.kill()
        raise AssertionError("web did not come up:\n" + proc.log()[-4000:])
    return proc, base_url


@pytest.fixture(scope="module")
def web(shared_stack):
    proc, base_url = started_web(shared_stack)
    yield base_url
    proc.kill()  # teardown: no graceful stop is under test here
