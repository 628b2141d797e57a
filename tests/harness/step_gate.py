"""The test side of a worker's step gate (worker/step_gate.py): hold a job ``running`` for as
long as the test needs, however fast or busy the machine, instead of hoping a long generation
outlasts the test's actions. The integration workers run with the gate's key set
(``WORKER_ENV``); the gate is open until a test closes it."""
from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Callable, Iterator

from core.events import QUEUED, RUNNING
from core.keys import TEST_STEP_GATE as KEY
from core.keys import step_gate_steps as steps_key
from tests.harness.stack import wait_until


@dataclass
class StepGate:
    client: Any  # a redis.Redis on the stack's server
    key: str = KEY
    store: Any = None  # a core.jobs.JobStore on a stack other tests use too (see close)

    @classmethod
    def on(cls, store: Any) -> "StepGate":
        return cls(store.client, store=store)

    def close(self, steps: int = 0) -> None:
        """From now on the worker's loop runs ``steps`` more steps, then one per :meth:`allow`.
        With a store, first waits until no job is running or queued: a job an earlier test left
        would take the steps, then hold the worker."""
        if self.store is not None:
            wait_until(lambda: not any(self.store.list(state=state, limit=50) for state in (RUNNING, QUEUED)), 60,
                       interval_s=0.05, what="no job left running or queued by an earlier test")
        self.client.delete(steps_key(self.key))
        self.client.set(self.key, "closed")
        self.allow(steps)

    def allow(self, steps: int) -> None:
        if steps:
            self.client.rpush(steps_key(self.key), *["step"] * steps)

    def allow_until(self, done: Callable[[], bool], what: str, timeout_s: float = 60) -> None:
        """One step at a time, each once the last was taken, until ``done()``: for a job whose
        worker shares the gate with others that may take some of the steps."""
        def granted() -> bool:
            if done():
                return True
            if not self.client.llen(steps_key(self.key)):
                self.allow(1)
            return False
        wait_until(granted, timeout_s, interval_s=0.02, what=what)

    def open(self) -> None:
        self.client.delete(self.key, steps_key(self.key))

    @contextmanager
    def closed(self, steps: int = 0) -> Iterator["StepGate"]:
        """Closed for the block (after ``steps`` steps), open again after it, whatever happens."""
        self.close(steps)
        try:
            yield self
        finally:
            self.open()
