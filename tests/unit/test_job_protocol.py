"""The job protocol on fakeredis: transitions, events, exactly-one terminal event."""
import json

import fakeredis
import pytest

from core import keys
from core.events import CANCELLED, FAILED, QUEUED, RUNNING, SUCCEEDED
from core.jobs import JobNotFound, JobStore


@pytest.fixture
def store():
    return JobStore(fakeredis.FakeRedis(decode_responses=True), ttl_s=60)


def test_create_and_get_round_trip(store):
    job = store.create("generate", "generation", {"prompt": "hi"}, owner="k1")
    got = store.get(job.id)
    assert got.state == QUEUED and got.request == {"prompt": "hi"} and got.attempt == 0
    assert "owner" not in got.public_view()
    with pytest.raises(JobNotFound):
        store.get(job.id, owner="other")
    with pytest.raises(JobNotFound):
        store.get("nope")


def test_attempt_events_and_finish(store):
    job = store.create("generate", "generation", {})
    started = store.start_attempt(job.id, "w1", lease_s=30)
    assert started.should_run and started.attempt == 1
    assert store.get(job.id).state == RUNNING
    assert store.append_event(job.id, 1, "token", {"text": "he"}) == 2
    assert store.append_event(job.id, 1, "token", {"text": "llo"}) == 3
    assert store.append_event(job.id, 2, "token", {"text": "x"}) == -3  # stale attempt
    assert store.finish(job.id, SUCCEEDED, {"text": "hello"}, attempt=1) == 4
    assert store.finish(job.id, FAILED, {"message": "late"}) == 0  # second terminal refused
    assert store.append_event(job.id, 1, "token", {"text": "!"}) == -1
    events = store.events(job.id)
    assert [e.seq for e in events] == [1, 2, 3, 4]
    assert [e.type for e in events] == ["state", "token", "token", "done"]
    assert events[-1].data == {"result": "job"}  # one copy: the result stays in the hash
    assert [e.seq for e in store.events(job.id, after_seq=2)] == [3, 4]
    record = store.get(job.id)
    assert record.state == SUCCEEDED and record.result == {"text": "hello"}
    assert store.expired_leases(now=10**12) == []  # lease released on finish


def test_live_channel_mirrors_stream(store):
    job = store.create("generate", "generation", {})
    pubsub = store.client.pubsub()
    pubsub.subscribe(keys.live_channel(job.id))
    pubsub.get_message(timeout=1)
    store.start_attempt(job.id, "w1", 30)
    store.append_event(job.id, 1, "token", {"text": "é"})
    messages = []
    while (msg := pubsub.get_message(timeout=0.2)) is not None:
        messages.append(json.loads(msg["data"]))
    assert [m["seq"] for m in messages] == [1, 2]
    assert messages[1] == {"seq": 2, "type": "token", "attempt": 1, "ts": messages[1]["ts"], "data": {"text": "é"}}


def test_cancel_queued_job_ends_it_at_once(store):
    job = store.create("generate", "generation", {})
    assert store.request_cancel(job.id).state == CANCELLED
    assert not store.start_attempt(job.id, "w1", 30).should_run
    assert [e.type for e in store.events(job.id)] == ["cancelled"]


def test_cancel_running_job_raises_flag(store):
    job = store.create("generate", "generation", {})
    store.start_attempt(job.id, "w1", 30)
    assert store.request_cancel(job.id).state == RUNNING
    assert store.cancel_requested(job.id)


def test_attempt_budget_fails_poison_job(store):
    job = store.create("generate", "generation", {}, max_attempts=2)
    assert store.start_attempt(job.id, "w1", 30).attempt == 1
    assert store.requeue(job.id, attempt=1) == 1  # the reaper: attempt 1's lease expired
    assert store.start_attempt(job.id, "w1", 30, dispatch=1).attempt == 2
    assert store.requeue(job.id, attempt=2) == 2
    exhausted = store.start_attempt(job.id, "w1", 30, dispatch=2)
    assert exhausted.attempt == -1 and not exhausted.should_run
    record = store.get(job.id)
    assert record.state == FAILED and record.error["code"] == "worker_lost"
    state_events = [e for e in store.events(job.id) if e.type == "state"]
    assert [e.data["restart"] for e in state_events if e.data["state"] == "running"] == [False, True]


def test_expired_lease_requeue(store):
    job = store.create("generate", "generation", {})
    store.start_attempt(job.id, "w1", lease_s=-1)
    assert store.expired_leases() == [job.id]
    assert store.requeue(job.id, attempt=1) == 1
    assert store.get(job.id).state == QUEUED
    assert store.expired_leases() == []
    assert store.requeue(job.id, attempt=1) == 0
    assert not store.start_attempt(job.id, "w1", 30, dispatch=0).should_run  # stale message
    assert store.start_attempt(job.id, "w2", 30, dispatch=1).attempt == 2


def test_workers_heartbeat_round_trip(store):
    from core.workers import list_workers, remove_worker, write_heartbeat
    write_heartbeat(store.client, "w1@host", {"model": "tiny", "current_jobs": []})
    [worker] = list_workers(store.client, max_age_s=30)
    assert worker["name"] == "w1@host" and worker["info"]["model"] == "tiny"
    remove_worker(store.client, "w1@host")
    assert list_workers(store.client, max_age_s=30) == []


def test_follow_replays_then_stops_at_terminal(store):
    job = store.create("generate", "generation", {})
    store.start_attempt(job.id, "w1", 30)
    store.append_event(job.id, 1, "token", {"text": "a"})
    store.finish(job.id, SUCCEEDED, {"text": "a"})
    seen = [e.seq for e in store.follow(job.id, after_seq=1) if e is not None]
    assert seen == [2, 3]


def test_list_filters(store):
    a = store.create("generate", "generation", {})
    b = store.create("agent", "agent", {})
    store.request_cancel(a.id)
    assert [j.id for j in store.list(job_type="agent")] == [b.id]
    assert [j.id for j in store.list(state=CANCELLED)] == [a.id]
    assert {j.id for j in store.list()} == {a.id, b.id}


def test_a_redelivered_message_never_starts_a_second_concurrent_attempt(store):
    """Issue 15: kombu restores unacked messages when its connection drops, so the message of
    a job that is still running can come back; only the reaper may start a new attempt."""
    job = store.create("generate", "generation", {})
    assert store.start_attempt(job.id, "w1", 30).attempt == 1
    again = store.start_attempt(job.id, "w2", 30)
    assert not again.should_run and again.seq == -1
    record = store.get(job.id)
    assert record.attempt == 1 and record.worker == "w1"
    assert [e.type for e in store.events(job.id)] == ["state"]


def test_a_started_attempt_hands_over_the_stored_request(store):
    """The worker reads the request in the round trip that starts the attempt (no HGETALL after)."""
    request = {"messages": [{"role": "user", "content": "é 一"}], "sampling": {"max_new_tokens": 3}}
    job = store.create("generate", "generation", request)
    started = store.start_attempt(job.id, "w1", 30)
    assert started.record is not None
    assert started.record.request == request and started.record.state == RUNNING
    assert started.record.attempt == started.attempt == 1
    assert started.record == store.get(job.id)
    assert store.start_attempt(job.id, "w1", 30).record is None  # already running: nothing to run
