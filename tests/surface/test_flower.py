"""Real Flower (``celery -A worker flower``) against the test broker lists our worker and a
finished task through its HTTP API (task events are on: the worker runs with ``-E``)."""
from __future__ import annotations

import sys

import pytest
import requests

from tests.harness.stack import free_port, spawn, wait_until
from tests.harness.step_gate import StepGate


@pytest.fixture(scope="module")
def flower(surface_stack, surface_worker):
    port = free_port()
    argv = [sys.executable, "-m", "celery", "-A", "worker", "flower", f"--port={port}", "--address=127.0.0.1",
            "--persistent=False", "--inspect_timeout=5000"]
    proc = spawn(f"flower-{port}", argv, surface_stack.env(FLOWER_UNAUTHENTICATED_API="true"), surface_stack.log_dir)
    url = f"http://127.0.0.1:{port}"

    def up() -> bool:
        try:
            return requests.get(f"{url}/healthcheck", timeout=1).status_code == 200
        except requests.RequestException:
            return False

    try:
        wait_until(up, 60, what="flower")
    except TimeoutError:
        proc.kill()
        raise AssertionError("flower did not come up:\n" + proc.log()[-4000:])
    yield url
    proc.kill()  # teardown: no graceful stop is under test here


def test_flower_lists_the_worker_and_a_finished_task(flower, base_url):
    def worker_listed() -> bool:
        workers = requests.get(f"{flower}/api/workers", params={"refresh": "1"}, timeout=15).json()
        return any(name.startswith("w1@") for name in workers)

    wait_until(worker_listed, 60, interval_s=1, what="flower to list the worker")
    response = requests.post(f"{base_url}/jobs", json={"prompt": "Hello there", "max_new_tokens": 4}, timeout=10)
    job_id = response.json()["id"]

    def task_done() -> bool:
        tasks = requests.get(f"{flower}/api/tasks", timeout=5).json()
        return tasks.get(job_id, {}).get("state") == "SUCCESS"

    wait_until(task_done, 60, interval_s=0.5, what="flower to see the task succeed")
    task = requests.get(f"{flower}/api/task/info/{job_id}", timeout=5).json()
    assert task["name"] == "miniserve.generate" and task["worker"].startswith("w1@")
    assert requests.get(f"{base_url}/jobs/{job_id}", timeout=5).json()["state"] == "succeeded"


def test_flower_shows_a_cancelled_job_revoked(flower, base_url, surface_store):
    """The job runner sends ``task-revoked`` for a job cancelled while it ran (the task
    itself returns without a result: Celery alone would show it STARTED forever)."""
    with StepGate.on(surface_store).closed(steps=3):  # running when the cancel comes
        response = requests.post(f"{base_url}/jobs", json={"prompt": "Count slowly", "max_new_tokens": 2048},
                                 timeout=10)
        job_id = response.json()["id"]
        wait_until(lambda: requests.get(f"{base_url}/jobs/{job_id}", timeout=5).json()["state"] == "running",
                   60, interval_s=0.2, what="the job to start")
        requests.post(f"{base_url}/jobs/{job_id}/cancel", timeout=10)

    def task_revoked() -> bool:
        return requests.get(f"{flower}/api/tasks", timeout=5).json().get(job_id, {}).get("state") == "REVOKED"

    wait_until(task_revoked, 60, interval_s=0.5, what="flower to see the task revoked")
    assert requests.get(f"{base_url}/jobs/{job_id}", timeout=5).json()["state"] == "cancelled"
