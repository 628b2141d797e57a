"""core.routing on fakeredis: who holds a prefix, liveness and load bounds, orphan rescue."""
import json

import fakeredis
import pytest

from core import keys, routing
from core.workers import write_heartbeat

LIMITS = routing.Limits(ttl_s=300, max_waiting=2)
NOW = 1_000_000.0


@pytest.fixture
def client():
    return fakeredis.FakeRedis(decode_responses=True)


def beat(client, name, node, running=0, concurrency=2, now=NOW):
    write_heartbeat(client, name, {"queue": keys.worker_queue(node), "concurrency": concurrency,
                                   "current_jobs": [f"j{i}" for i in range(running)]}, now=now)


def test_no_key_and_unknown_prefix_use_the_shared_queue(client):
    assert routing.choose(client, None, LIMITS, NOW) == routing.Decision("generation", routing.NO_KEY)
    assert routing.choose(client, "abc", LIMITS, NOW).reason == routing.UNKNOWN


def test_routes_to_the_live_holder(client):
    beat(client, "a@h1:1", "a@h1")
    routing.note_prefix(client, "abc", "a@h1:1", ttl_s=300, now=NOW)
    decision = routing.choose(client, "abc", LIMITS, NOW + 1)
    assert decision == routing.Decision("generation.a@h1", routing.HIT, "a@h1:1")


def test_stale_claim_and_dead_holder_are_not_used(client):
    beat(client, "a@h1:1", "a@h1", now=NOW)
    routing.note_prefix(client, "abc", "a@h1:1", ttl_s=300, now=NOW)
    assert routing.choose(client, "abc", LIMITS, NOW + 301).reason == routing.UNKNOWN  # claim too old
    beat(client, "a@h1:1", "a@h1", now=NOW - routing.ALIVE_S - 1)  # heartbeat stopped
    assert routing.choose(client, "abc", LIMITS, NOW).reason == routing.BUSY


def test_busy_holder_is_skipped_and_the_least_loaded_wins(client):
    beat(client, "a@h1:1", "a@h1", running=1)
    beat(client, "b@h2:1", "b@h2", running=0)
    for name in ("a@h1:1", "b@h2:1"):
        routing.note_prefix(client, "abc", name, ttl_s=300, now=NOW)
    assert routing.choose(client, "abc", LIMITS, NOW).worker == "b@h2:1"
    client.rpush("generation.b@h2", "m1", "m2")  # b's own queue is full (max_waiting 2)
    assert routing.choose(client, "abc", LIMITS, NOW).worker == "a@h1:1"
    beat(client, "a@h1:1", "a@h1", running=2, concurrency=1)  # running + waiting >= concurrency + 2
    client.rpush("generation.a@h1", "m3")
    assert routing.choose(client, "abc", LIMITS, NOW).reason == routing.BUSY


def test_counts(client):
    routing.count(client, routing.Decision("generation.a@h", routing.HIT, "a@h:1"))
    routing.count(client, routing.Decision("generation.a@h", routing.HIT, "a@h:1"))
    routing.count(client, routing.Decision("generation", routing.UNKNOWN))
    assert routing.counts(client) == {routing.HIT: 2, routing.NO_KEY: 0, routing.UNKNOWN: 1, routing.BUSY: 0,
                                      routing.OFF: 0}
    assert routing.routed_to(client) == {"a@h:1": 2}


def test_waiting_per_worker(client):
    beat(client, "a@h1:1", "a@h1")
    client.lpush("generation.a@h1", "m1", "m2")
    workers = [{"name": "a@h1:1", "info": {"queue": "generation.a@h1"}}, {"name": "old", "info": {}}]
    assert routing.waiting(client, workers) == {"a@h1:1": 2}


def test_orphans_of_a_dead_worker_move_to_the_shared_queue_in_order(client):
    routing.register_queue(client, "generation.a@h1", "a@h1:1")
    routing.register_queue(client, "generation.b@h2", "b@h2:1")
    beat(client, "a@h1:1", "a@h1", now=NOW - 60)  # dead
    beat(client, "b@h2:1", "b@h2", now=NOW)  # alive
    client.lpush("generation", "older-shared")
    for message in ("a1", "a2", "a3"):  # kombu LPUSHes and consumes from the right
        client.lpush("generation.a@h1", message)
    client.lpush("generation.b@h2", "b1")
    assert routing.rescue_orphans(client, now=NOW) == 3
    assert client.llen("generation.a@h1") == 0 and client.lrange("generation.b@h2", 0, -1) == ["b1"]
    consumed = [client.rpop("generation") for _ in range(4)]
    assert consumed == ["a1", "a2", "a3", "older-shared"]  # rescued first, oldest first


def test_describe_is_json(client):
    info = routing.describe(routing.Decision("generation", routing.UNKNOWN), "abc", 64)
    assert json.loads(json.dumps(info))["decision"] == "not_cached"


def test_only_holders_of_the_jobs_model_are_chosen(client):
    for name, node, model in (("a@h1:1", "a@h1", "alpha"), ("b@h2:1", "b@h2", "beta")):
        write_heartbeat(client, name, {"queue": keys.worker_queue(node), "concurrency": 2, "current_jobs": [],
                                       "model_id": model}, now=NOW)
        routing.note_prefix(client, "abc", name, 300, now=NOW)
    assert routing.choose(client, "abc", LIMITS, NOW, model="beta", home="generation.beta").worker == "b@h2:1"
    assert routing.choose(client, "abc", LIMITS, NOW, model="gamma", home="generation.gamma") == \
        routing.Decision("generation.gamma", routing.BUSY)  # holders exist, none serves gamma
    assert routing.choose(client, None, LIMITS, NOW, model="beta", home="generation.beta").queue == "generation.beta"


def test_orphans_go_back_to_their_models_queue(client):
    routing.register_queue(client, "generation.b@h2", "b@h2:1", home="generation.beta")
    beat(client, "b@h2:1", "b@h2", now=NOW - 60)  # dead
    client.lpush("generation.b@h2", "b1")
    assert routing.rescue_orphans(client, now=NOW) == 1
    assert client.lrange("generation.beta", 0, -1) == ["b1"] and client.llen("generation") == 0
