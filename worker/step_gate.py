"""A test's gate on a worker's engine steps, across processes (``MINISERVE_TEST_STEP_GATE``).

Full-path tests need a job that stays ``running`` while they act on it (cancel it, look at the
pool, queue others behind it). A long generation only makes that likely: a fast CPU finishes
it first. With this gate the test decides: while the key exists, the worker's loop runs one
turn of steps per item the test pushes onto ``<key>:steps`` and none without one; deleting the
key opens the gate (tests/harness/step_gate.py). Off unless the setting names a key.

The gate has its own client, without retries and with a short timeout, so a Redis outage
never stalls the loop thread on it; through an outage the gate stays as it was last read. An
open gate stays open (generation goes on while Redis is down, as without a gate); a closed one
holds, so a test that restarts Redis keeps its job running across the outage (the key comes
back with the append-only file; without it the gate is open again).
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from core.keys import step_gate_steps
from core.redis_conn import redis_client

WAIT_S = 0.05  # one turn's wait for a step; then the loop takes its inbox (cancels) again
SOCKET_TIMEOUT_S = 1.0


@dataclass
class RedisStepGate:
    """The engine loop's ``step_gate``: True lets one turn's steps run."""

    client: Any  # a redis.Redis
    key: str
    closed: bool = False  # as last read

    @classmethod
    def from_settings(cls, settings: Any) -> "RedisStepGate":
        return cls(redis_client(settings, decode_responses=True, socket_timeout=SOCKET_TIMEOUT_S,
                                socket_connect_timeout=SOCKET_TIMEOUT_S, retry=Retry(NoBackoff(), 0)),
                   settings.test_step_gate)

    def __call__(self) -> bool:
        try:
            self.closed = bool(self.client.exists(self.key))
            if not self.closed:
                return True
            return self.client.blpop([step_gate_steps(self.key)], timeout=WAIT_S) is not None
        except redis.RedisError:
            if self.closed:
                time.sleep(WAIT_S)  # a refused connection answers at once: no faster turns than with Redis up
            return not self.closed
