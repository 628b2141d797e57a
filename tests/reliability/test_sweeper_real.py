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
