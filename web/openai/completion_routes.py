"""``POST /v1/completions``: OpenAI's legacy text completion, served through the job queue.

A request becomes one ``completion`` job (every prompt and every one of its ``n`` choices),
queued, cancellable and visible like any other. Without ``stream`` the route waits for the
job; with it, it follows the job's events (``web.openai.follow.follow_job``) and writes
``text_completion`` chunks, each with its ``index`` and, with ``logprobs``, the legacy
log-probabilities of the tokens it holds.
"""
from __future__ import annotations

import logging
from typing import Any, Iterator

from flask import jsonify
from flask_openapi3 import APIBlueprint, Tag

from core.jobs import JobRecord, JobStore
from core.logs import log_event
from web.context import ctx
from web.openai.completion_answer import CompletionChunkWriter, text_completion
from web.openai.completion_convert import CompletionJob, completion_job
from web.openai.completion_schemas import Completion, CompletionRequest
from web.openai.responses import model_id
from web.openai.follow import ERRORS, event_stream, follow_job, stream_ending
from web.job_wait import finished_job  # waits; maps failed/cancelled/timeout to errors
from web.stream_limit import freed_on_error, limited, take_stream_slot
from web.submit import submit

logger = logging.getLogger("miniserve.web.openai")
api = APIBlueprint("openai_completions", __name__, url_prefix="/v1",
                   abp_tags=[Tag(name="openai", description="OpenAI-compatible API (through the queue)")])


@api.post("/completions", summary="Text completion (OpenAI's legacy API), optionally streamed",
          responses={200: Completion, **ERRORS})
def completions(body: CompletionRequest):
    """Runs as a ``completion`` job: the prompt as is (no chat template). MiniServe
    extensions: ``generation_method``, ``top_k``, ``repetition_penalty``, ``speculative``;
    the answer adds ``miniserve`` and the ``X-Job-Id`` header."""
    cjob = completion_job(body)
    slot = take_stream_slot() if cjob.stream else None  # a 429 here submits no job
    with freed_on_error(slot):
        job = submit(cjob.submission).job
    log_event(logger, "completion_submitted", job_id=job.id, stream=cjob.stream, prompts=len(cjob.prompts),
              n=cjob.n)
    model = job.request.get("model") or model_id(ctx().settings)
    if cjob.stream:
        events = stream_text(ctx().store, ctx().celery, job, cjob, model)
        return limited(event_stream(events, job.id), slot)
    response = jsonify(text_completion(finished_job(job.id), cjob, model))
    response.headers["X-Job-Id"] = job.id
    return response


def stream_text(store: JobStore, celery: Any, job: JobRecord, cjob: CompletionJob, model: str) -> Iterator[str]:
    writer = CompletionChunkWriter(job, cjob, model)
    return follow_job(store, celery, job, writer.opening(), writer.token,
                      lambda event_type, payload: stream_ending(writer, event_type, payload, False), writer.error)
