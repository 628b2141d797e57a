"""Continuing a job's answer after its worker died: what earlier attempts streamed.

A single-choice generation job's token events carry the ids whose text they complete
(``ids``, :meth:`worker.job_runner.JobContext._with_tokens`). When a later attempt starts
(the reaper noticed the dead worker: worker/reaper.py), it reads those events back, and the
engine prefills the prompt plus those ids and decodes on (:class:`engine.types.Resume`). The
client's stream goes on with the next piece: no text repeated, none lost; the result and its
``usage`` are the whole answer. Sampling is seeded per position (engine/sampling.py), so a
seeded job continues exactly as an uninterrupted run would; a greedy one too, up to the
rounding of a prefill against a decode step.

Jobs of several choices (``n`` > 1, several prompts) and agent jobs start over instead:
their stream shows the restart (a ``state`` event with ``restart: true``) and goes on with
the new attempt's text.
"""
from __future__ import annotations

from core.events import TOKEN, Event
from engine.types import Resume


def streamed_answer(events: list[Event], attempt: int) -> Resume | None:
    """The answer so far, from the token events of attempts before ``attempt``; None when
    there is nothing to continue or it cannot be known (a chunk without ids: written by a
    worker that did not record them; a chunk of another choice)."""
    ids: list[int] = []
    chars = 0
    logprobs: list[dict] = []
    for event in events:
        if event.type != TOKEN or event.attempt >= attempt:
            continue
        if "ids" not in event.data or "index" in event.data:
            return None
        ids.extend(int(i) for i in event.data["ids"])
        chars += len(event.data.get("text") or "")
        logprobs.extend(event.data.get("logprobs") or ())
    if not ids and not chars:
        return None
    return Resume(ids=tuple(ids), text_chars=chars, logprobs=tuple(logprobs))
