"""The embedding worker's engine loop: one thread owns the model and runs concurrent
requests' inputs together.

Job threads call :meth:`EmbeddingBatcher.submit` with token-id inputs and wait on the
returned :class:`EmbedHandle`; they never touch the model. Each turn the loop takes in
every request that arrived, then runs one forward over at most ``max_batch`` inputs, taken
from the waiting requests in turn (one input from each, round and round), so a request of a
thousand inputs shares every forward with requests that came after it instead of holding
the thread until it finishes. A request whose handle was cancelled is dropped between
forwards. Within a forward the inputs are sorted by length, so little padding is run.
"""
from __future__ import annotations

import queue
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Callable, Protocol

import torch


class Embedder(Protocol):
    def embed(self, batch: list[list[int]]) -> torch.Tensor: ...


class EmbedCancelled(RuntimeError):
    """The request was cancelled (or timed out) before all its inputs ran."""


@dataclass
class EmbedHandle:
    """One request's inputs and, once done, its vectors (in the inputs' order) or its error."""

    inputs: list[list[int]]
    vectors: list[torch.Tensor | None] = field(default_factory=list)
    error: BaseException | None = None
    done: threading.Event = field(default_factory=threading.Event)
    started_at: float | None = None     # monotonic time of its first forward
    finished_at: float | None = None
    forwards: int = 0                   # forwards that ran some of its inputs
    _cancelled: bool = False

    def __post_init__(self) -> None:
        self.vectors = [None] * len(self.inputs)

    def cancel(self) -> None:
        self._cancelled = True

    def result(self, should_cancel: Callable[[], bool] | None = None, poll_s: float = 0.05) -> torch.Tensor:
        """[inputs, dimensions]; waits, polling ``should_cancel`` (then cancels and raises)."""
        while not self.done.wait(poll_s):
            if should_cancel is not None and should_cancel():
                self.cancel()
                raise EmbedCancelled("cancelled while waiting for the embedding model")
        if self.error is not None:
            raise self.error
        return torch.stack(self.vectors)  # type: ignore[arg-type]


@dataclass
class _Pending:
    handle: EmbedHandle
    todo: deque[int]  # indices of inputs not yet run


class EmbeddingBatcher:
    """The loop thread (started on the first submit) and its inbox."""

    def __init__(self, model: Embedder, max_batch: int = 32) -> None:
        self.model = model
        self.max_batch = max_batch
        self._inbox: queue.SimpleQueue[EmbedHandle] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._start_lock = threading.Lock()
        self.forwards = 0           # counters for the heartbeat (written by the loop only)
        self.inputs_run = 0

    def submit(self, inputs: list[list[int]]) -> EmbedHandle:
        handle = EmbedHandle(inputs)
        if not inputs:
            handle.done.set()
            return handle
        self._ensure_thread()
        self._inbox.put(handle)
        return handle

    def _ensure_thread(self) -> None:
        if self._thread is None:
            with self._start_lock:
                if self._thread is None:
                    self._thread = threading.Thread(target=self._run, name="miniserve-embedding-loop", daemon=True)
                    self._thread.start()

    def _run(self) -> None:
        pending: deque[_Pending] = deque()
        while True:
            if not pending:
                pending.append(self._pending(self._inbox.get()))
            while True:
                try:
                    pending.append(self._pending(self._inbox.get_nowait()))
                except queue.Empty:
                    break
            self.step(pending)

    @staticmethod
    def _pending(handle: EmbedHandle) -> _Pending:
        return _Pending(handle, deque(range(len(handle.inputs))))

    def step(self, pending: deque[_Pending]) -> None:
        """One forward over inputs taken in turn from the pending requests; finished and
        cancelled requests leave ``pending``."""
        for item in [p for p in pending if p.handle._cancelled]:
            pending.remove(item)
            _finish(item.handle, EmbedCancelled("cancelled"))
        chosen = take_in_turn(pending, self.max_batch)
        if not chosen:
            return
        chosen.sort(key=lambda pair: len(pair[0].handle.inputs[pair[1]]))
        now = time.monotonic()
        try:
            vectors = self.model.embed([item.handle.inputs[index] for item, index in chosen])
        except Exception as exc:  # noqa: BLE001 - the requests in this forward fail; the loop lives
            for item in {id(item): item for item, _ in chosen}.values():
                pending.remove(item)
                _finish(item.handle, exc)
            return
        self.forwards += 1
        self.inputs_run += len(chosen)
        for item in {id(item): item for item, _ in chosen}.values():
            item.handle.forwards += 1
            if item.handle.started_at is None:
                item.handle.started_at = now
        for row, (item, index) in enumerate(chosen):
            item.handle.vectors[index] = vectors[row]
        for item in [p for p in pending if not p.todo]:
            pending.remove(item)
            _finish(item.handle, None)


def take_in_turn(pending: deque[_Pending], capacity: int) -> list[tuple[_Pending, int]]:
    """Up to ``capacity`` (request, input index) pairs: one input from each pending request in
    arrival order, then again, until the batch is full or every input is taken."""
    chosen: list[tuple[_Pending, int]] = []
    while len(chosen) < capacity and any(p.todo for p in pending):
        for item in pending:
            if item.todo and len(chosen) < capacity:
                chosen.append((item, item.todo.popleft()))
    return chosen


def _finish(handle: EmbedHandle, error: BaseException | None) -> None:
    handle.error = error
    handle.finished_at = time.monotonic()
    handle.done.set()
