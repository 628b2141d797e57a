"""Bounded bytes per job (issue 15, item 8): the result is stored once (the terminal event
holds a summary), token ids only when asked for, text chunks coalesced into fewer events."""
from __future__ import annotations

import fakeredis
import pytest

from core.coalesce import TextCoalescer
from core.events import CANCELLED, SUCCEEDED
from core.jobs import JobStore
from core.payloads import event_summary, stored_payload

RESULT = {"text": "Hello world", "token_ids": [1, 2, 3], "finish_reason": "length", "method": "paged",
          "usage": {"prompt_tokens": 4, "completion_tokens": 3, "cached_tokens": 0},
          "timings": {"ttft_s": 0.1, "total_s": 0.3, "decode_tokens_per_s": 10.0}}


@pytest.fixture
def store():
    return JobStore(fakeredis.FakeRedis(decode_responses=True), ttl_s=60)


def finished(store: JobStore, state: str, payload: dict, **kwargs):
    job = store.create("generate", "generation", {})
    attempt = store.start_attempt(job.id, "w", 30).attempt
    assert store.finish(job.id, state, payload, attempt=attempt, **kwargs)
    return store.get(job.id), store.events(job.id)[-1]


def test_result_is_stored_once_without_token_ids(store):
    record, done = finished(store, SUCCEEDED, RESULT)
    assert record.result == {k: v for k, v in RESULT.items() if k != "token_ids"}
    assert done.data == {"finish_reason": "length", "method": "paged", "usage": RESULT["usage"],
                         "timings": RESULT["timings"], "result": "job"}


def test_token_ids_are_kept_when_asked_for(store):
    record, done = finished(store, SUCCEEDED, RESULT, keep_token_ids=True)
    assert record.result["token_ids"] == [1, 2, 3] and "token_ids" not in done.data


def test_error_partials_are_summarised_too(store):
    error = {"code": "cancelled", "message": "cancelled by request", "partial": RESULT}
    record, event = finished(store, CANCELLED, error)
    assert record.error["partial"]["text"] == "Hello world" and "token_ids" not in record.error["partial"]
    assert event.data["code"] == "cancelled" and "text" not in event.data["partial"]
    assert event.data["partial"]["usage"] == RESULT["usage"] and event.data["result"] == "job"


def test_small_payloads_are_left_alone():
    assert event_summary({"code": "x", "message": "y"}) == {"code": "x", "message": "y"}
    assert stored_payload({"a": 1}) == {"a": 1}


def test_text_within_the_interval_joins_the_next_event():
    now = [0.0]
    coalescer = TextCoalescer(interval_s=0.1, clock=lambda: now[0])
    assert coalescer.add("He") == "He"  # the first chunk goes out at once
    now[0] = 0.03
    assert coalescer.add("l") is None
    now[0] = 0.06
    assert coalescer.add("l") is None
    now[0] = 0.11
    assert coalescer.add("o") == "llo"
    now[0] = 0.12
    assert coalescer.add(" w") is None
    assert coalescer.flush() == " w" and coalescer.flush() is None


def test_interval_zero_sends_every_chunk():
    coalescer = TextCoalescer(interval_s=0.0)
    assert [coalescer.add(t) for t in "abc"] == ["a", "b", "c"]


def test_held_text_goes_out_before_other_events(store):
    import time

    from worker.job_runner import JobContext

    job = store.create("generate", "generation", {})
    attempt = store.start_attempt(job.id, "w", 30).attempt
    now = [0.0]
    ctx = JobContext(store, store.get(job.id), attempt, deadline=time.monotonic() + 60,
                     text=TextCoalescer(0.1, clock=lambda: now[0]))
    for piece in ("a", "b", "c"):
        ctx.on_text(piece)
    ctx.emit("tool_step", {"step": 1})
    ctx.on_text("d")
    ctx.flush_text()
    events = store.events(job.id)[1:]
    assert [(e.type, e.data) for e in events] == [("token", {"text": "a"}), ("token", {"text": "bc"}),
                                                  ("tool_step", {"step": 1}), ("token", {"text": "d"})]


def test_token_events_count_the_jobs_tokens_across_engine_requests(store):
    """Once the job follows an engine request, each token event says how many tokens the job
    has generated up to its end (an agent's second call counts on from the first's total)."""
    import time
    from types import SimpleNamespace

    from worker.job_runner import JobContext

    job = store.create("agent", "agent", {})
    attempt = store.start_attempt(job.id, "w", 30).attempt
    ctx = JobContext(store, store.get(job.id), attempt, deadline=time.monotonic() + 60,
                     text=TextCoalescer(interval_s=0.0))
    handle = SimpleNamespace(tokens_streamed=0)
    ctx.follow_tokens(handle)
    for piece, count in (("a", 1), ("bc", 3)):
        handle.tokens_streamed = count
        ctx.on_text(piece)
    ctx.end_tokens(4)  # an end-of-text token came after the last text
    second = SimpleNamespace(tokens_streamed=2)
    ctx.follow_tokens(second)
    ctx.on_text("d")
    assert [e.data for e in store.events(job.id)[1:]] == [
        {"text": "a", "tokens": 1}, {"text": "bc", "tokens": 3}, {"text": "d", "tokens": 6}]
