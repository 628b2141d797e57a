"""The embedding loop: inputs of concurrent requests share forwards, taken in turn; every
request gets its own vectors in its own order; cancelled and failed requests end."""
from __future__ import annotations

import threading
from collections import deque

import pytest
import torch

from engine.embedding.batcher import EmbedCancelled, EmbedHandle, EmbeddingBatcher, _Pending

SAFETY_S = 30


class FakeEmbedder:
    """Vector = [first id, length]; records each forward's batch; can hold a forward on a gate."""

    def __init__(self, gate: threading.Event | None = None, fail_on: int | None = None) -> None:
        self.batches: list[list[list[int]]] = []
        self.gate, self.fail_on = gate, fail_on
        self.entered = threading.Event()

    def embed(self, batch):
        self.batches.append(batch)
        self.entered.set()
        if self.gate is not None:
            assert self.gate.wait(SAFETY_S)
        if self.fail_on is not None and any(ids[0] == self.fail_on for ids in batch):
            raise RuntimeError("boom")
        return torch.tensor([[float(ids[0]), float(len(ids))] for ids in batch])


def pending(batcher: EmbeddingBatcher, *requests):
    """Handles for ``requests`` and the loop's pending queue, to drive ``step`` by hand."""
    handles = [EmbedHandle(inputs) for inputs in requests]
    return handles, deque(_Pending(h, deque(range(len(h.inputs)))) for h in handles)


def test_a_forward_takes_one_input_from_each_request_in_turn():
    model = FakeEmbedder()
    batcher = EmbeddingBatcher(model, max_batch=4)
    big = [[i, 0] for i in range(100, 110)]
    small = [[1], [2, 2]]
    handles, queue = pending(batcher, big, small)
    batcher.step(queue)
    # one from each in turn, then sorted by length for the forward
    assert sorted(map(tuple, model.batches[0])) == sorted([(100, 0), (1,), (101, 0), (2, 2)])
    assert [len(ids) for ids in model.batches[0]] == sorted(len(ids) for ids in model.batches[0])
    assert handles[1].done.is_set() and not handles[0].done.is_set()  # the small one finished first
    assert handles[1].result().tolist() == [[1.0, 1.0], [2.0, 2.0]]
    while queue:
        batcher.step(queue)
    assert len(model.batches) == 3  # 12 inputs, 4 per forward
    assert handles[0].result()[:, 0].tolist() == [float(i) for i in range(100, 110)]  # its own order
    assert batcher.inputs_run == 12 and handles[0].forwards == 3


def test_a_cancelled_request_leaves_between_forwards():
    model = FakeEmbedder()
    batcher = EmbeddingBatcher(model, max_batch=2)
    handles, queue = pending(batcher, [[i] for i in range(6)], [[50]])
    batcher.step(queue)
    handles[0].cancel()
    batcher.step(queue)
    assert not queue and len(model.batches) == 1
    with pytest.raises(EmbedCancelled):
        handles[0].result()
    assert handles[1].result().tolist() == [[50.0, 1.0]]


def test_a_failed_forward_fails_its_requests_and_the_loop_goes_on():
    model = FakeEmbedder(fail_on=666)
    batcher = EmbeddingBatcher(model, max_batch=8)
    handles, queue = pending(batcher, [[666]], [[7]])
    batcher.step(queue)
    assert not queue
    for handle in handles:
        with pytest.raises(RuntimeError, match="boom"):
            handle.result()
    later, queue = pending(batcher, [[8]])
    batcher.step(queue)
    assert later[0].result().tolist() == [[8.0, 1.0]]


def test_requests_that_arrive_while_a_forward_runs_share_the_next_one():
    gate = threading.Event()
    model = FakeEmbedder(gate=gate)
    batcher = EmbeddingBatcher(model, max_batch=32)
    first = batcher.submit([[1]])
    assert model.entered.wait(SAFETY_S)  # the loop thread is inside the first forward
    others = [batcher.submit([[10 + i], [20 + i, 0]]) for i in range(3)]
    gate.set()
    assert first.result().tolist() == [[1.0, 1.0]]
    for i, handle in enumerate(others):
        assert handle.result().tolist() == [[10.0 + i, 1.0], [20.0 + i, 2.0]]
    assert [len(batch) for batch in model.batches] == [1, 6]
    assert {h.forwards for h in others} == {1}


def test_result_polls_should_cancel_and_cancels_the_handle():
    gate = threading.Event()
    model = FakeEmbedder(gate=gate)
    batcher = EmbeddingBatcher(model, max_batch=1)
    blocker = batcher.submit([[1]])
    assert model.entered.wait(SAFETY_S)
    waiting = batcher.submit([[2]])
    with pytest.raises(EmbedCancelled):
        waiting.result(should_cancel=lambda: True)
    gate.set()
    assert blocker.result().tolist() == [[1.0, 1.0]]
    assert waiting.done.wait(SAFETY_S) and [b for b in model.batches if b == [[2]]] == []
