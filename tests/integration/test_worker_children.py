"""Every kind of child process a worker has, SIGKILLed while a job runs: the job ends in
exactly one terminal state, and the next job starts and succeeds (no wait for the broker's
visibility timeout). Real redis-server, real Celery workers, the tiny model.

The kinds, found by listing the worker's descendants (``/proc``, through psutil) while jobs run:

- the default threads pool: none. The jobs run in threads of the main process, so there is
  no child to lose; the first test proves it, in the middle of a job of each method.
- the prefork pool (``MINISERVE_WORKER_POOL=prefork``): the pool process that holds the model
  and runs the job. Celery replaces it; the job is re-delivered (``task_reject_on_worker_lost``).
- the C compiler, run once per machine to build the ``q8`` kernel (``engine/quant/native``)
  while the first worker loads its model: a run killed from outside is run again.
"""
from __future__ import annotations

import os
import signal
import time

import psutil
import pytest

from core.events import RUNNING, SUCCEEDED, TERMINAL_EVENTS
from tests.harness.stack import wait_until
from tests.harness.step_gate import StepGate
from tests.tiny_model import make_tiny_model_dir
from tests.integration.conftest import (
    gen_request, sleep_until_tokens, submit, wait_for_worker, wait_terminal,
)

pytestmark = pytest.mark.integration
COMPILERS = {"cc", "gcc", "cc1", "as", "collect2", "ld", "clang"}


def request_for(method: str, max_new_tokens: int) -> dict:
    return {**gen_request(max_new_tokens=max_new_tokens), "method": method}


def descendants(pid: int) -> list[psutil.Process]:
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []


def terminal_events(store, job_id: str) -> int:
    return sum(e.type in TERMINAL_EVENTS for e in store.events(job_id))


def assert_next_job_runs_within_a_lease(store, celery_client) -> None:
    """A new job starts and succeeds: a replaced pool process takes the next message (a
    worker left without one would hold it until the broker's visibility timeout, hours, far
    past this 60 s safety net)."""
    job = submit(store, celery_client, request_for("paged", 8))
    wait_until(lambda: store.get(job.id).state != "queued", 60, interval_s=0.05, what="the next job to start")
    assert wait_terminal(store, job.id, 60).state == SUCCEEDED


def test_the_threads_pool_has_no_child_process_to_lose(stack, store, celery_client):
    worker = stack.start_worker(name="threads", pool="threads", concurrency=4)
    try:
        wait_for_worker(store)
        for method in ("paged", "official", "no_cache", "custom_cache", "prefix_cache"):
            with StepGate(store.client).closed(steps=3):  # running while the test looks
                job = submit(store, celery_client, request_for(method, 64))
                sleep_until_tokens(store, job.id, 1)  # the first chunk goes out at once
                assert store.get(job.id).state == RUNNING
                assert descendants(worker.popen.pid) == [], f"{method}: {descendants(worker.popen.pid)}"
                store.request_cancel(job.id)
            wait_terminal(store, job.id, 60)
        assert_next_job_runs_within_a_lease(store, celery_client)
    finally:
        worker.kill()  # teardown: no graceful stop is under test here


def test_a_killed_prefork_child_is_replaced_and_the_next_job_runs(stack, store, celery_client):
    # The lease and the dead-worker window far past the safety nets: the job waits for neither.
    # The message Celery re-delivers to the new child finds the job held by a process that is
    # gone and re-queues it at once (worker.reaper.requeue_if_holder_gone).
    worker = stack.start_worker(name="prefork", pool="prefork", concurrency=1, MINISERVE_LEASE_S="3600",
                                MINISERVE_WORKER_DEAD_S="3600")
    try:
        wait_for_worker(store)
        with StepGate(store.client).closed(steps=3):  # attempt 1 is running when its process is killed
            job = submit(store, celery_client, request_for("paged", 64))
            sleep_until_tokens(store, job.id, 1)  # the first chunk goes out at once
            children = descendants(worker.popen.pid)
            running_in = int(store.get(job.id).worker.rsplit(":", 1)[1])
            assert [c.pid for c in children] == [running_in]  # the one pool process, running the job
            assert store.get(job.id).state == RUNNING
            for child in children:
                os.kill(child.pid, signal.SIGKILL)
        record = wait_terminal(store, job.id, 120)
        assert (record.state, record.attempt) == (SUCCEEDED, 2)  # re-delivered to the new child
        assert terminal_events(store, job.id) == 1
        reasons = [e.data.get("reason") for e in store.events(job.id) if e.type == "state" and e.data.get("reason")]
        assert reasons == ["process_lost"]
        assert_next_job_runs_within_a_lease(store, celery_client)
        assert worker.popen.poll() is None and len(descendants(worker.popen.pid)) == 1
    finally:
        worker.kill()  # teardown: no graceful stop is under test here


def test_a_killed_kernel_compiler_is_run_again(stack, store, celery_client, tmp_path):
    """A bf16 ``q8`` worker with an empty cache builds its kernel while loading: kill the compiler."""
    model = make_tiny_model_dir(tmp_path / "model", intermediate_size=128)  # inputs in groups of 32, as q8 needs
    worker = stack.start_worker(name="compiler", pool="threads", concurrency=2, MINISERVE_MODEL=str(model),
                                MINISERVE_DTYPE="bfloat16", MINISERVE_QUANT="q8",
                                MINISERVE_CACHE_DIR=str(tmp_path / "cache"))
    try:
        job = submit(store, celery_client, request_for("paged", 8))
        killed = kill_first_compiler(worker.popen.pid, timeout_s=600)  # a nice'd start can be slow
        assert killed, "no compiler process was seen: the kernel was not built by this worker"
        wait_for_worker(store, timeout_s=180)
        (info,) = [w["info"] for w in wait_for_worker(store)]
        assert info["quant"] == "q8", info["quant"]  # the kernel was built after all
        assert "kernel_build_failed" in worker.log()
        record = wait_terminal(store, job.id, 90)
        assert record.state == SUCCEEDED and terminal_events(store, job.id) == 1
        assert_next_job_runs_within_a_lease(store, celery_client)
    finally:
        worker.kill()  # teardown: no graceful stop is under test here


def kill_first_compiler(pid: int, timeout_s: float) -> list[str]:
    """SIGKILL the worker's compiler processes as soon as one shows up; their names."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        found = [p for p in descendants(pid) if _name(p) in COMPILERS]
        if found:
            for proc in found:
                try:
                    proc.send_signal(signal.SIGKILL)
                except psutil.NoSuchProcess:
                    pass
            return [_name(p) for p in found]
        time.sleep(0.01)
    return []


def _name(proc: psutil.Process) -> str:
    try:
        return proc.name()
    except psutil.NoSuchProcess:
        return ""
