"""A small HTTP client for MiniServe used by the tests and benchmarks: submit jobs and follow their SSE."""
from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any, Iterator

import requests


@dataclass
class SseEvent:
    id: int | None
    type: str
    data: dict[str, Any]


def iter_sse(response: requests.Response, place_frames: bool = False) -> Iterator[SseEvent]:
    """Parse a ``text/event-stream`` response into events (comments and retry lines skipped;
    a queued job's place-in-line frames, ``queued`` without an ``id:``, only with
    ``place_frames``: they are not stored events)."""
    event_id, event_type, data_lines = None, "message", []
    for raw in response.iter_lines(decode_unicode=True):
        if raw is None:
            continue
        if raw == "":
            if data_lines and (place_frames or event_id is not None or event_type != "queued"):
                yield SseEvent(event_id, event_type, json.loads("\n".join(data_lines)))
            event_id, event_type, data_lines = None, "message", []
        elif raw.startswith(":") or raw.startswith("retry:"):
            continue
        elif raw.startswith("id:"):
            event_id = int(raw[3:].strip())
        elif raw.startswith("event:"):
            event_type = raw[6:].strip()
        elif raw.startswith("data:"):
            data_lines.append(raw[5:].lstrip())


@dataclass
class JobTrace:
    """What a client saw of one job: timings from submit, and the streamed events."""

    job_id: str
    submit_s: float
    first_event_s: float | None = None
    first_token_s: float | None = None
    total_s: float | None = None
    terminal: str | None = None
    text: str = ""
    seqs: list[int] = field(default_factory=list)


def submit_and_follow(base_url: str, body: dict[str, Any], session: requests.Session | None = None,
                      timeout_s: float = 300, headers: dict[str, str] | None = None) -> JobTrace:
    """POST /jobs, then follow GET /jobs/{id}/events to the terminal event."""
    http = session or requests.Session()
    started = time.perf_counter()
    reply = http.post(f"{base_url}/jobs", json=body, timeout=timeout_s, headers=headers)
    reply.raise_for_status()
    job_id = reply.json()["id"]
    trace = JobTrace(job_id=job_id, submit_s=time.perf_counter() - started)
    with http.get(f"{base_url}/jobs/{job_id}/events", stream=True, timeout=timeout_s, headers=headers) as events:
        for event in iter_sse(events):
            now = time.perf_counter() - started
            trace.seqs.append(event.id)
            trace.first_event_s = trace.first_event_s or now
            if event.type == "token":
                trace.first_token_s = trace.first_token_s or now
                trace.text += event.data["data"]["text"]
            if event.type in ("done", "error", "cancelled", "timeout"):
                trace.terminal, trace.total_s = event.type, now
                break
    return trace
