"""Celery tasks. Each takes the job id (the Celery task id is the job id) and a dispatch
number; the job's request lives in Redis, not in the message."""
from __future__ import annotations

from typing import Any

from core import tasks as names
from worker.app import app
from worker.job_runner import JobContext, run_job
from worker.requests import generation_request_from
from worker.runtime import runtime


def run_generation(ctx: JobContext) -> dict[str, Any]:
    rt = runtime()
    request = generation_request_from(ctx.record.request, rt.settings.default_max_new_tokens)
    result = rt.engine.generate(request, on_text=ctx.on_text, should_cancel=ctx.should_cancel)
    return result.to_dict()


@app.task(name=names.GENERATE, ignore_result=True)
def generate(job_id: str, dispatch: int = 0) -> None:
    run_job(runtime(), job_id, dispatch, run_generation)
