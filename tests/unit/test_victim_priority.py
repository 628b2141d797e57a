"""The paged scheduler's victim choice: lower classes (larger priority number) yield first,
and the existing rule (quiet hog first, else most recently admitted) holds within a class."""
from types import SimpleNamespace

from engine.batching.scheduler import Scheduler


def _seq(seq_id: int, priority: int, produced: bool, tokens: int) -> SimpleNamespace:
    return SimpleNamespace(seq_id=seq_id, priority=priority, n=tokens,
                           run=SimpleNamespace(produced="x" if produced else ""))


def _victim(running: list) -> SimpleNamespace:
    fake = SimpleNamespace(running=running,
                           blocks=SimpleNamespace(num_tokens=lambda sid: next(s.n for s in running if s.seq_id == sid)))
    return Scheduler._victim(fake)


def test_batch_yields_before_interactive_even_if_streaming() -> None:
    inter_quiet = _seq(1, 0, produced=False, tokens=900)
    batch_streaming = _seq(2, 2, produced=True, tokens=10)
    assert _victim([batch_streaming, inter_quiet]) is batch_streaming


def test_within_class_quiet_hog_first() -> None:
    a = _seq(1, 2, produced=True, tokens=50)
    b = _seq(2, 2, produced=False, tokens=30)
    c = _seq(3, 2, produced=False, tokens=300)
    keep = _seq(4, 0, produced=False, tokens=999)
    assert _victim([a, b, c, keep]) is c


def test_within_class_most_recent_streaming() -> None:
    a = _seq(1, 1, produced=True, tokens=50)
    b = _seq(2, 1, produced=True, tokens=30)
    keep = _seq(3, 0, produced=True, tokens=5)
    assert _victim([a, b, keep]) is b


def test_single_class_unchanged() -> None:
    a = _seq(1, 1, produced=True, tokens=50)
    b = _seq(2, 1, produced=True, tokens=30)
    assert _victim([a, b]) is b


def test_waiting_queue_admits_by_class_then_arrival() -> None:
    from collections import deque
    fake = SimpleNamespace(waiting=deque())
    order = [(1, 2), (2, 1), (3, 2), (4, 0), (5, 1), (6, 0)]
    for sid, prio in order:
        Scheduler.submit(fake, SimpleNamespace(seq_id=sid, priority=prio, status=None))
    assert [s.seq_id for s in fake.waiting] == [4, 6, 2, 5, 1, 3]
