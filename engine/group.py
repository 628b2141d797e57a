"""Consuming a group of requests (:meth:`engine.loop.EngineLoop.submit_group`) in one thread.

A job with ``n`` choices, or a completion with several prompts, has one thread (the job's)
and several handles. :func:`stream_group` reads them in turn, so each member's text and
log-probabilities reach the callbacks tagged with its index, in order within the member,
and the job's cancel check stops every member at once.
"""
from __future__ import annotations

import queue
import time
from typing import Any, Callable

from engine.loop import ERROR, LOGPROBS, RESULT, TEXT, RequestHandle
from engine.types import CancelCheck, GenerationResult

IndexedText = Callable[[int, str], None]
IndexedLogprobs = Callable[[int, list[dict[str, Any]]], None]
IDLE_S = 0.01  # nothing came from any member: wait this long before looking again


def _cancel_all(handles: list[RequestHandle]) -> None:
    for handle in handles:
        handle.cancel()


def _take(handle: RequestHandle) -> tuple[str, Any] | None:
    try:
        return handle.outputs.get_nowait()
    except queue.Empty:
        return None


def stream_group(handles: list[RequestHandle], on_text: IndexedText | None = None,
                 on_logprobs: IndexedLogprobs | None = None, should_cancel: CancelCheck | None = None,
                 on_start: Callable[[float], None] | None = None) -> list[GenerationResult]:
    """Every member's result, in order; the first member error is raised once all have
    ended (the others are cancelled). ``on_start`` is called once, when the first member
    starts. A callback that raises cancels the whole group, then raises."""
    results: list[GenerationResult | None] = [None] * len(handles)
    error: BaseException | None = None
    open_members = list(range(len(handles)))
    notified = False
    try:
        while open_members:
            moved = False
            for index in list(open_members):
                item = _take(handles[index])
                if item is None:
                    continue
                moved = True
                kind, value = item
                if kind == TEXT:  # (piece, generated, covered tokens so far), as RequestHandle.stream reads it
                    piece, handles[index].tokens_streamed, handles[index].tokens_covered = value
                    if on_text is not None:
                        on_text(index, piece)
                elif kind == LOGPROBS and on_logprobs is not None:
                    on_logprobs(index, value)
                elif kind in (RESULT, ERROR):
                    open_members.remove(index)
                    if kind == RESULT:
                        results[index] = value
                    elif error is None:
                        error = value
                        _cancel_all(handles)
            if not notified and any(h.started.is_set() for h in handles):
                notified = True
                if on_start is not None:
                    on_start(min(h.started_at or time.monotonic() for h in handles if h.started.is_set()))
            if should_cancel is not None and should_cancel():
                _cancel_all(handles)
            if not moved:
                time.sleep(IDLE_S)
    except BaseException:
        _cancel_all(handles)
        raise
    if error is not None:
        raise error
    return [r for r in results if r is not None]
