"""Celery tasks. Each takes the job id (the Celery task id is the job id) and a dispatch
number; the job's request lives in Redis, not in the message."""
from __future__ import annotations

from contextlib import nullcontext
from typing import Any

from core import tasks as names
from core.events import TOOL_STEP
from engine.types import GenerationRequest, GenerationResult
from worker.app import app
from worker.job_runner import JobContext, JobFailed, run_job
from worker.requests import generation_request_from
from worker.runtime import WorkerRuntime, runtime

BATCHED_METHOD = "paged"


class WorkerGenerator:
    """The engine as seen by one job: ``paged`` requests join the shared batch, the other
    methods take the process's exclusive lock (they hold single-request state)."""

    def __init__(self, rt: WorkerRuntime) -> None:
        self.rt = rt

    def generate(self, request: GenerationRequest, on_text=None, should_cancel=None) -> GenerationResult:
        guard = nullcontext() if request.method == BATCHED_METHOD else self.rt.exclusive
        with guard:
            return self.rt.engine.generate(request, on_text=on_text, should_cancel=should_cancel)


def run_generation(ctx: JobContext) -> dict[str, Any]:
    rt = runtime()
    request = generation_request_from(ctx.record.request, rt.settings.default_max_new_tokens)
    result = WorkerGenerator(rt).generate(request, on_text=ctx.on_text, should_cancel=ctx.should_cancel)
    return result.to_dict()


def run_agent(ctx: JobContext) -> dict[str, Any]:
    from agent.model import EngineChatModel
    from agent.runner import AgentRunner
    from tools import create_default_registry

    rt = runtime()
    stored = ctx.record.request
    prompt = next(m["content"] for m in reversed(stored["messages"]) if m["role"] == "user")
    model = EngineChatModel(WorkerGenerator(rt), method=stored.get("method") or BATCHED_METHOD,
                            should_cancel=ctx.should_cancel)
    runner = AgentRunner(model, create_default_registry())
    result = runner.run(prompt, max_steps=stored.get("max_steps"),
                        max_new_tokens=(stored.get("sampling") or {}).get("max_new_tokens"),
                        on_step=lambda step: ctx.emit(TOOL_STEP, step), on_text=ctx.on_text)
    payload = result.to_dict()
    payload["usage"] = {"prompt_tokens": model.prompt_tokens, "completion_tokens": model.completion_tokens}
    if not result.ok:
        raise JobFailed(result.status, result.error or result.status, trace=payload["trace"],
                        outputs=payload["outputs"], usage=payload["usage"])
    return payload


@app.task(name=names.GENERATE, ignore_result=True)
def generate(job_id: str, dispatch: int = 0) -> None:
    run_job(runtime(), job_id, dispatch, run_generation)


@app.task(name=names.AGENT, ignore_result=True)
def agent(job_id: str, dispatch: int = 0) -> None:
    run_job(runtime(), job_id, dispatch, run_agent)
