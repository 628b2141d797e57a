"""Benchmark jobs (``POST /bench``): measured on the worker's own engine, the summary stored
as the job result, progress streamed as ``progress`` events."""
from __future__ import annotations

import functools
from typing import Any

from celery import Task

from core import tasks as names
from core.methods import BATCHED_METHOD, CUSTOM_CACHE
from worker.app import app
from worker.celery_state import TASK_THROWS
from worker.job_runner import BadJobRequest, JobContext
from worker.requests import generation_request_from
from worker.runtime import runtime
from worker.tasks import WorkerGenerator, run_task

PROGRESS = "progress"


def generation_methods(ctx: JobContext) -> dict[str, Any]:
    """Every method answers the same prompt greedily; latencies side by side, tokens compared."""
    from dataclasses import replace

    rt = runtime()
    base = generation_request_from(ctx.record.request, rt.settings.default_max_new_tokens)
    base = replace(base, sampling=replace(base.sampling, temperature=0.0, seed=None, stop=()))
    generator, rows = WorkerGenerator(rt, ctx), []
    methods = rt.engine.methods
    for index, method in enumerate(methods):
        if ctx.should_cancel():
            break
        result = generator.generate(replace(base, method=method), should_cancel=ctx.should_cancel)
        rows.append({"method": method, "ttft_s": result.timings.ttft_s, "total_s": result.timings.total_s,
                     "decode_tokens_per_s": result.timings.decode_tokens_per_s,
                     "completion_tokens": result.usage.completion_tokens,
                     "cached_tokens": result.usage.cached_tokens, "token_ids": result.token_ids})
        ctx.emit(PROGRESS, {"done": index + 1, "total": len(methods), "method": method})
    reference = rows[0]["token_ids"] if rows else []
    for row in rows:
        row["same_tokens_as_" + rows[0]["method"]] = row.pop("token_ids") == reference
    return {"benchmark": "generation_methods", "methods": rows,
            "identical": all(r["same_tokens_as_" + rows[0]["method"]] for r in rows)}


def agent_eval(ctx: JobContext) -> dict[str, Any]:
    """The agent evaluation cases, one after another on this worker (greedy)."""
    from agent.evaluation import load_cases, run_case, summarize
    from agent.model import EngineChatModel

    rt = runtime()
    stored = ctx.record.request
    cases = load_cases(categories=stored.get("categories") or None, limit=stored.get("limit"))
    method = BATCHED_METHOD if rt.batching else CUSTOM_CACHE
    model = EngineChatModel(WorkerGenerator(rt, ctx), method=method, should_cancel=ctx.should_cancel)
    records = []
    for index, case in enumerate(cases):
        if ctx.should_cancel():
            break
        records.append(run_case(model, _registry(), case))
        ctx.emit(PROGRESS, {"done": index + 1, "total": len(cases), "case": case.id,
                            "correct": bool(records[-1]["e2e_ok"])})
    return {"benchmark": "agent_eval", "summary": summarize(records), "records": records}


@functools.lru_cache(maxsize=1)
def _registry():
    from tools import create_default_registry

    return create_default_registry()


BENCHMARKS = {"generation_methods": generation_methods, "agent_eval": agent_eval}


def run_benchmark(ctx: JobContext) -> dict[str, Any]:
    name = ctx.record.request.get("benchmark")
    if name not in BENCHMARKS:
        raise BadJobRequest(f"unknown benchmark: {name!r}")
    return BENCHMARKS[name](ctx)


@app.task(name=names.BENCH, bind=True, throws=TASK_THROWS)
def bench(self: Task, job_id: str, dispatch: int = 0) -> dict[str, Any]:
    return run_task(self, job_id, dispatch, run_benchmark)
