"""The step gate's Redis side (worker/step_gate.py) and the tests' handle on it
(tests/harness/step_gate.py), on fakeredis: what each turn of the loop is told."""
from __future__ import annotations

import fakeredis
import redis

from tests.harness.step_gate import StepGate
from worker.step_gate import RedisStepGate


def test_the_loop_runs_one_turn_per_step_the_test_allows_while_the_gate_is_closed():
    client = fakeredis.FakeRedis(decode_responses=True)
    test, loop = StepGate(client), RedisStepGate(client, StepGate.key)
    assert [loop(), loop()] == [True, True]  # no key: open
    test.close(steps=2)
    assert [loop(), loop(), loop()] == [True, True, False]
    test.allow(1)
    assert [loop(), loop()] == [True, False]
    test.open()
    assert loop() and client.keys("*") == []


def test_closing_again_forgets_the_steps_left_over():
    client = fakeredis.FakeRedis(decode_responses=True)
    test, loop = StepGate(client), RedisStepGate(client, StepGate.key)
    test.close(steps=5)
    test.close(steps=1)
    assert [loop(), loop()] == [True, False]


def test_through_a_redis_outage_the_gate_stays_as_it_was_last_read():
    client = fakeredis.FakeRedis(decode_responses=True)
    test, loop = StepGate(client), RedisStepGate(client, StepGate.key)

    class Down:
        def exists(self, *keys):
            raise redis.ConnectionError("stopped by the test")

    assert loop() is True
    loop.client = Down()
    assert loop() is True  # open stays open: generation goes on while Redis is down
    loop.client = client
    test.close(steps=1)
    assert loop() is True
    loop.client = Down()
    assert loop() is False  # closed stays closed: the held job is still held after the outage
    loop.client = client
    test.open()
    assert loop() is True


def test_the_gate_opens_after_a_test_block_that_raises():
    client = fakeredis.FakeRedis(decode_responses=True)
    test = StepGate(client)
    try:
        with test.closed(steps=1):
            raise RuntimeError("a failing assertion")
    except RuntimeError:
        pass
    assert RedisStepGate(client, StepGate.key)() and client.keys("*") == []
