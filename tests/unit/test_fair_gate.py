"""The fair gate (fakeredis): a full window holds jobs; releases go by class, then by turns
between owners; a held job's place is where the gate actually releases it; a held job is
not 'undispatched' (the sweeper must not send it past the gate) until it is released."""
import fakeredis
import pytest

from core import keys
from core.events import CANCELLED
from core.fair_gate import FairGate, send_released
from core.jobs import JobStore

QUEUE = "generation"


@pytest.fixture
def store():
    return JobStore(fakeredis.FakeRedis(decode_responses=True), ttl_s=60)


def _job(store, gate, owner="a", priority="default", queue=QUEUE):
    job = store.create("generate", queue, {"model": "m", "priority": priority}, owner=owner)
    return job.id, gate.admit(job.id, queue, priority, owner)


def _start(store, job_id):
    assert store.start_attempt(job_id, "w1", lease_s=30).should_run


def _drain(store, gate, queue=QUEUE):
    """Start jobs one at a time (window 1): the order the gate lets them through."""
    order = []
    while True:
        line = store.client.zrange(keys.line_key(queue), 0, -1)
        if not line:
            line = gate.release(queue)
            if not line:
                return order
        for job_id in line:
            _start(store, job_id)
            order.append(job_id)


def test_a_full_window_holds_and_a_start_makes_room(store):
    gate = FairGate(store.client, window=2)
    first, second, third = (_job(store, gate) for _ in range(3))
    assert [first[1], second[1], third[1]] == [1, 1, 0]
    assert store.client.zscore(keys.UNDISPATCHED, third[0]) is None  # held: not the sweeper's to send
    assert gate.release(QUEUE) == []  # the window is still full
    _start(store, first[0])
    assert gate.release(QUEUE) == [third[0]]
    assert store.client.zscore(keys.UNDISPATCHED, third[0]) is not None  # released: sent or swept
    assert gate.held_queues() == [] and gate.held_counts() == {}


def test_a_more_urgent_class_is_released_first(store):
    gate = FairGate(store.client, window=1)
    running, _ = _job(store, gate)
    batch = [_job(store, gate, priority="batch")[0] for _ in range(2)]
    default = _job(store, gate, priority="default")[0]
    interactive = _job(store, gate, priority="interactive")[0]
    _start(store, running)
    assert _drain(store, gate) == [interactive, default, *batch]


def test_owners_take_turns_within_a_class(store):
    gate = FairGate(store.client, window=1)
    first, _ = _job(store, gate, owner="a")
    flood = [_job(store, gate, owner="a")[0] for _ in range(5)]
    late = [_job(store, gate, owner="b")[0] for _ in range(2)]
    _start(store, first)
    assert _drain(store, gate) == [flood[0], late[0], flood[1], late[1], *flood[2:]]


def test_a_new_job_waits_behind_held_ones_even_when_the_window_has_room(store):
    gate = FairGate(store.client, window=1)
    running, _ = _job(store, gate)
    held, _ = _job(store, gate)
    _start(store, running)  # room now, but nobody released yet
    later, admitted = _job(store, gate)
    assert admitted == 0
    assert _drain(store, gate) == [held, later]


def test_a_cancelled_held_job_is_passed_over(store):
    gate = FairGate(store.client, window=1)
    running, _ = _job(store, gate)
    cancelled, kept = _job(store, gate)[0], _job(store, gate)[0]
    store.finish(cancelled, CANCELLED, {"reason": "test"})
    _start(store, running)
    assert _drain(store, gate) == [kept]


def test_an_owner_counts_its_jobs_until_they_start_or_end(store):
    gate = FairGate(store.client, window=1)
    jobs = [_job(store, gate, owner="a")[0] for _ in range(3)]
    assert gate.queued_by("a") == 3 and gate.queued_by("b") == 0
    _start(store, jobs[0])
    store.finish(jobs[2], CANCELLED, {"reason": "test"})
    assert gate.queued_by("a") == 1
    store.finish(jobs[2], CANCELLED, {"reason": "again"})  # no second decrement
    assert gate.queued_by("a") == 1


def test_a_held_jobs_place_is_where_the_gate_releases_it(store):
    gate = FairGate(store.client, window=1)
    running, _ = _job(store, gate, owner="a")
    held = [_job(store, gate, owner=o, priority=p)[0]
            for o, p in [("a", "batch"), ("a", "default"), ("b", "default"), ("a", "default"),
                         ("c", "interactive"), ("b", "batch"), ("a", "default"), ("c", "default")]]
    places = {job_id: gate.held_place(job_id).ahead for job_id in held}
    _start(store, running)
    order = _drain(store, gate)
    assert sorted(order) == sorted(held)
    assert places == {job_id: 1 + order.index(job_id) for job_id in held}  # 1: the first job's message
    assert gate.held_place(running) is None


def test_window_zero_admits_everything(store):
    gate = FairGate(store.client, window=0)
    assert {_job(store, gate)[1] for _ in range(50)} == {1}


class Sender:
    def __init__(self):
        self.sent = []

    def send_task(self, name, args=None, kwargs=None, **options):
        self.sent.append((name, args, kwargs, options["queue"]))


def test_released_jobs_are_sent_with_their_task_and_model_and_confirmed(store):
    gate = FairGate(store.client, window=1)
    running, _ = _job(store, gate)
    held, _ = _job(store, gate)
    _start(store, running)
    celery = Sender()
    assert send_released(gate, store, celery, QUEUE) == [held]
    assert celery.sent == [("miniserve.generate", [held], {"model": "m"}, QUEUE)]
    assert store.client.zscore(keys.UNDISPATCHED, held) is None
    assert store.client.zscore(keys.PENDING, held) is not None


def test_batch_jobs_leave_the_reserved_slots_to_the_other_classes(store):
    """3 slots, 1 reserved: at most 2 batch jobs run or wait in the line; an interactive job
    arriving then goes out with the release that follows its hold, and a batch job's end
    lets the next batch job go."""
    gate = FairGate(store.client, window=10, reserved_slots=1)
    batch = [_job_on(store, gate, "batch", slots=3) for _ in range(4)]
    assert [admitted for _, admitted in batch] == [1, 1, 0, 0]
    _start(store, batch[0][0])
    _start(store, batch[1][0])
    assert gate.release(QUEUE, slots=3) == []  # two batch jobs run: the cap
    urgent, admitted = _job_on(store, gate, "interactive", slots=3)
    assert admitted == 0 and gate.release(QUEUE, slots=3) == [urgent]  # held behind no one: out at once
    store.finish(batch[0][0], "succeeded", {"text": ""}, attempt=1)
    assert gate.release(QUEUE, slots=3) == [batch[2][0]]


def test_the_running_count_forgets_jobs_that_ended_without_a_word(store):
    """A job requeued after its worker died is no longer running: the cap does not count it."""
    gate = FairGate(store.client, window=10, reserved_slots=1)
    first, _ = _job_on(store, gate, "batch", slots=2)
    held, admitted = _job_on(store, gate, "batch", slots=2)
    assert admitted == 0
    _start(store, first)
    store.client.hset(keys.job_key(first), "state", "queued")  # as the reaper's requeue leaves it
    assert gate.release(QUEUE, slots=2) == [held]


def test_queue_slots_count_live_chat_workers_and_one_per_prefork_child(store):
    import json
    import time as clock

    def beat(name, **info):
        store.client.zadd(keys.WORKERS_INDEX, {name: clock.time()})
        store.client.hset(keys.worker_key(name), mapping={k: json.dumps(v) for k, v in info.items()})

    beat("a:1", pool="threads", concurrency=8, model_id="m", model_kind="chat")
    beat("b:1", pool="prefork", concurrency=4, model_id="m", model_kind="chat")
    beat("b:2", pool="prefork", concurrency=4, model_id="m", model_kind="chat")
    beat("e:1", pool="threads", concurrency=8, model_id="e", model_kind="embedding")
    from core.fair_gate import queue_slots

    assert queue_slots(store.client, "generation") == 10
    assert queue_slots(store.client, "generation.m") == 10 and queue_slots(store.client, "embedding.e") == 8


def _job_on(store, gate, priority, slots):
    job = store.create("generate", QUEUE, {"priority": priority}, owner="a")
    return job.id, gate.admit(job.id, QUEUE, priority, "a", slots=slots)
