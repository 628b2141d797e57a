"""web/feeds.py: one reader per followed job, shared by its streams; a stream behind the
feed's buffer re-reads the gap from Redis and still gets every event once."""
from __future__ import annotations

import threading
import time

from core.events import Event
from web import feeds as feeds_module
from web.feeds import FeedHub, JobFeed
from web import sse as sse_module
from web.sse import format_event, stream_events


def event(seq: int, kind: str = "token") -> Event:
    return Event(seq=seq, type=kind, attempt=1, ts=0.0, data={"text": str(seq)})


def test_after_bisects_the_buffer_and_says_when_a_gap_was_dropped(store, monkeypatch):
    monkeypatch.setattr(feeds_module, "MAX_BUFFERED", 8)
    feed = JobFeed(store, "0" * 32, start=0, block_ms=100)
    feed._add([event(s) for s in range(1, 6)], format_event)
    assert [i.event.seq for i in feed.after(2)] == [3, 4, 5] and feed.after(5) == []
    feed._add([event(s) for s in range(4, 12)], format_event)  # 4 and 5 again: kept once
    assert feed.seqs == [i.event.seq for i in feed.buffer] == [8, 9, 10, 11] and feed.start == 7
    assert feed.after(3) is None and [i.event.seq for i in feed.after(7)] == [8, 9, 10, 11]


def test_streams_of_one_job_share_one_feed_and_get_every_event(store, monkeypatch):
    monkeypatch.setattr(feeds_module, "MAX_BUFFERED", 4)  # the late stream falls behind it
    job = store.create("generation", "generation", {"prompt": "hi"})
    attempt = store.start_attempt(job.id, "w", lease_s=30).attempt
    hub = FeedHub(store, format_event)
    texts: dict[str, list[str]] = {"a": [], "b": []}

    def follow(name: str) -> None:
        for chunk in stream_events(store, store.get(job.id), 0, 1, hub):
            texts[name].append(chunk)

    readers = [threading.Thread(target=follow, args=(name,)) for name in texts]
    for reader in readers:
        reader.start()
    deadline = time.monotonic() + 5
    while job.id not in hub.feeds and time.monotonic() < deadline:
        time.sleep(0.01)
    assert len(hub.feeds) == 1
    for i in range(20):
        store.append_event(job.id, attempt, "token", {"text": f"t{i}"})
    store.finish(job.id, "succeeded", {"text": ""}, attempt=attempt)
    for reader in readers:
        reader.join(10)
    wanted = "".join(format_event(e) for e in store.events(job.id))  # events that are ready share a chunk
    for name, chunks in texts.items():
        assert "".join(c for c in chunks if c.startswith("id:")) == wanted, name
    deadline = time.monotonic() + 5
    while hub.feeds and time.monotonic() < deadline:
        time.sleep(0.05)
    assert hub.feeds == {}  # no readers left: the feed stopped


def test_events_that_are_ready_go_out_joined_in_chunks_up_to_the_cap(store, monkeypatch):
    monkeypatch.setattr(sse_module, "CHUNK_CHARS", 600)
    job = store.create("generation", "generation", {"prompt": "hi"})
    attempt = store.start_attempt(job.id, "w", lease_s=30).attempt
    for i in range(30):
        store.append_event(job.id, attempt, "token", {"text": f"t{i}"})
    store.finish(job.id, "succeeded", {"text": ""}, attempt=attempt)
    frames = [format_event(e) for e in store.events(job.id)]
    chunks = list(stream_events(store, store.get(job.id), 0, 1, FeedHub(store, format_event)))
    assert chunks[0].startswith("retry:") and "".join(chunks[1:]) == "".join(frames)
    assert 1 < len(chunks) - 1 <= len(frames) // 4  # one write per ~600 characters, not one per event
    assert all(len(chunk) < 600 + max(map(len, frames)) for chunk in chunks[1:])
