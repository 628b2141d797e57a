"""A job whose task message was never sent does not stay queued forever (issue 15, item 7),
on a real redis-server and Celery worker: as if the web died right after creating the job
(and its Idempotency-Key, in one atomic step), the job is in Redis with no message. The
worker's sweeper re-sends it after one lease (4 s here); it runs once and succeeds, and a
client retrying with the same key gets that same job."""
from __future__ import annotations

import pytest

from core.events import SUCCEEDED
from tests.integration.conftest import gen_request, wait_terminal

pytestmark = pytest.mark.integration


def test_a_job_created_without_its_message_is_re_sent_and_runs_once(store, worker):
    job, replayed = store.create_idempotent("generate", "generation", gen_request(max_new_tokens=8),
                                            idempotency_key="retry-me", owner="")
    assert not replayed and store.client.llen("generation") == 0  # no message: the "crash"
    record = wait_terminal(store, job.id, 60)
    assert record.state == SUCCEEDED and record.attempt == 1 and record.dispatch == 1
    again, replayed = store.create_idempotent("generate", "generation", {}, idempotency_key="retry-me", owner="")
    assert replayed and again.id == job.id
    log = worker.log()
    assert '"job_redispatched"' in log and job.id in log
    assert sum(1 for line in log.splitlines() if '"job_started"' in line and job.id in line) == 1


def test_a_message_lost_on_its_way_to_a_worker_is_re_sent(stack, store, celery_client):
    """A worker that popped a message and died before kombu recorded it as unacked (two
    steps in kombu): the message is gone. Simulated by popping it ourselves, then starting
    a worker: its sweeper sees the pending job's message nowhere and re-sends it."""
    from tests.integration.conftest import _started_worker, submit

    job = submit(store, celery_client, gen_request(max_new_tokens=8))
    assert store.client.lpop("generation") is not None  # the "dead worker" took it
    worker = _started_worker(stack, store)
    try:
        record = wait_terminal(store, job.id, 60)
        assert record.state == SUCCEEDED and record.attempt == 1 and record.dispatch == 1
        assert '"task message stranded"' in worker.log()
    finally:
        worker.kill()  # teardown: no graceful stop is under test here
