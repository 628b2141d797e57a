"""Priorities and fair share on the real stack (redis-server, web, Celery worker, tiny model).

Jobs are submitted while no worker runs, so they wait at the fair gate (window 1); then one
worker (one slot) starts and the test reads the order the jobs started in. That order is
what the gate decides, not a race: more urgent classes first, API keys taking turns within a
class, whatever the machine's speed. A held job's ``queue_position`` is checked against the
place it then really started at."""
from __future__ import annotations

import pytest
import requests

from tests.integration.conftest import _started_worker, started_web, wait_terminal

pytestmark = pytest.mark.integration

KEY_A, KEY_B = "key-a", "key-b"


@pytest.fixture
def gated_web(stack):
    proc, url = started_web(stack, MINISERVE_API_KEYS=f"{KEY_A},{KEY_B}", MINISERVE_QUEUE_WINDOW="1")
    yield url
    proc.kill()  # teardown: no graceful stop is under test here


def post_job(url: str, key: str, **body) -> str:
    response = requests.post(f"{url}/jobs", json={"prompt": "Hello", "max_new_tokens": 2, **body},
                             headers={"Authorization": f"Bearer {key}"}, timeout=30)
    assert response.status_code == 202, response.text
    return response.json()["id"]


def position(url: str, key: str, job_id: str) -> int:
    view = requests.get(f"{url}/jobs/{job_id}", headers={"Authorization": f"Bearer {key}"}, timeout=30).json()
    assert view["state"] == "queued", view
    return view["queue_position"]


def start_order(stack, store, job_ids: list[str]) -> list[str]:
    """Start one worker with one slot, wait for every job, return them in the order they started."""
    worker = _started_worker(stack, store)
    try:
        for job_id in job_ids:
            assert wait_terminal(store, job_id, 120).state == "succeeded"
    finally:
        worker.kill()  # teardown: no graceful stop is under test here
    return sorted(job_ids, key=lambda job_id: store.get(job_id).started_at)


def test_a_key_that_floods_the_queue_delays_its_own_jobs_not_another_keys(stack, store, gated_web):
    flood = [post_job(gated_web, KEY_A) for _ in range(10)]
    late = [post_job(gated_web, KEY_B) for _ in range(3)]
    places = {job_id: position(gated_web, KEY_B, job_id) for job_id in late}
    order = start_order(stack, store, flood + late)
    # The first job's message went out at once (the window had room); then the keys take turns.
    assert order == [flood[0], flood[1], late[0], flood[2], late[1], flood[3], late[2], *flood[4:]]
    assert places == {job_id: order.index(job_id) for job_id in late}


def test_a_more_urgent_class_starts_first_whatever_it_was_sent_after(stack, store, gated_web):
    batch = [post_job(gated_web, KEY_A, priority="batch") for _ in range(3)]
    default = post_job(gated_web, KEY_A)  # /jobs' default class
    interactive = [post_job(gated_web, KEY_B, priority="interactive") for _ in range(2)]
    order = start_order(stack, store, [*batch, default, *interactive])
    assert order == [batch[0], *interactive, default, *batch[1:]]
