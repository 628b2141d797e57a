"""Following a job's events as a streamed ``/v1`` answer, shared by every streaming surface
(chat, completions, responses, Ollama's): keep-alives while idle, the terminal event's full
payload, the job cancelled when the client leaves, and OpenAI's error shape for the routes."""
from __future__ import annotations

import logging
from typing import Any, Callable, Iterator

import redis
from flask import Response, stream_with_context

from core.events import CANCELLED, DONE, TIMEOUT, TOKEN, Event
from core.jobs import JobRecord, JobStore
from core.logs import log_event
from web.cancel import cancel_job
from web.openai.responses import ChunkWriter
from web.openai.schemas import OpenAIError
from web.sse import stream_over

logger = logging.getLogger("miniserve.web.openai")
ERRORS: dict[int, Any] = {code: OpenAIError for code in (400, 401, 404, 409, 413, 415, 429, 500, 503, 504)}
KEEPALIVE = ": keep-alive\n\n"
TICK_S = 1  # idle ticks while following a job: how soon a vanished client is noticed


def event_stream(events: Any, job_id: str) -> Response:
    """An SSE response of ``events`` for job ``job_id`` (no caching, no proxy buffering)."""
    response = Response(stream_with_context(events), mimetype="text/event-stream")
    response.headers.update({"Cache-Control": "no-cache", "X-Accel-Buffering": "no", "X-Job-Id": job_id})
    return response


def follow_job(store: JobStore, celery: Any, job: JobRecord, opening: list[str],
               token: Callable[[dict[str, Any]], Iterator[str]],
               ending: Callable[[str, dict[str, Any]], Iterator[str]],
               error: Callable[[str, str, str], str]) -> Iterator[str]:
    """A streamed ``/v1`` answer: the ``opening`` chunks, ``token(data)`` per token event,
    keep-alives while idle, ``ending(type, payload)`` at the terminal event (its full
    payload); the job is cancelled when the client leaves before that."""
    ended, last = False, 0
    try:
        yield from opening
        for event in store.follow(job.id, block_ms=TICK_S * 1000):
            if event is None:
                if stream_over(store, job.id, last):
                    ended = True
                    yield error("server_error", "the job's events are gone", "job_expired")
                    return
                yield KEEPALIVE
                continue
            last = event.seq
            if event.type == TOKEN:
                yield from token(event.data)
            elif event.is_terminal:
                ended = True
                yield from ending(event.type, _full_payload(store, job.id, event))
                return
    except GeneratorExit:
        if not ended:
            abandon(store, celery, job.id)
        raise
    except (redis.ConnectionError, redis.TimeoutError) as exc:
        # Redis went away mid-stream: the job goes on (its worker retries its writes), but
        # this stream cannot; it ends with an error chunk rather than a cut connection.
        log_event(logger, "chat_stream_store_lost", level=logging.WARNING, job_id=job.id, exc_type=type(exc).__name__)
        yield error("server_error", f"the job store is unreachable; job {job.id} goes on: read it at "
                    f"/jobs/{job.id} when the service is back", "store_unavailable")
    except Exception as exc:  # noqa: BLE001 - any other failure still ends the stream in OpenAI's shape
        log_event(logger, "chat_stream_failed", level=logging.ERROR, job_id=job.id, exc_type=type(exc).__name__)
        yield error("server_error", f"the stream of job {job.id} failed on the server", "stream_failed")


def _full_payload(store: JobStore, job_id: str, event: Event) -> dict[str, Any]:
    """The terminal event holds a summary (``core.payloads``): the full result or error,
    text included, is in the job record."""
    record = store.get(job_id)
    return (record.result if event.type == DONE else record.error) or event.data


def stream_ending(writer: ChunkWriter, event_type: str, data: dict[str, Any], buffered: bool,
            streamed_calls: set[int] | bool = False) -> Iterator[str]:
    if event_type == DONE:
        yield from writer.ending(data, buffered, streamed_calls)
    else:
        message = str(data.get("message") or data.get("reason") or event_type)
        if event_type == CANCELLED:
            yield writer.error("conflict_error", message, "job_cancelled")
        elif event_type == TIMEOUT:
            yield writer.error("timeout_error", message, "job_timeout")
        else:
            yield writer.error("server_error", message, str(data.get("code") or "job_failed"))
    yield writer.done()


def abandon(store: JobStore, celery: Any, job_id: str) -> None:
    """The client left: cancel its job (revoke the task too when it never started)."""
    try:
        job, was_queued = cancel_job(store, celery, job_id)
        log_event(logger, "chat_stream_abandoned", job_id=job_id, was_queued=was_queued, state=job.state)
    except Exception as exc:  # noqa: BLE001 - the client is gone; nobody to tell but the log
        log_event(logger, "chat_abandon_failed", level=logging.WARNING, job_id=job_id, error=type(exc).__name__)
