"""The agent evaluation as Celery tasks: one task per case, fanned out as a group.

From the CLI (workers consuming the ``agent`` queue must be running)::

    celery -A worker call miniserve.agent_eval --queue bench \\
        --kwargs '{"categories": ["calculator"], "limit": 4, "output": "results/agent_eval_celery.csv"}'
    celery -A worker result <task id printed above>     # the chord id; then
    celery -A worker result <chord id>                  # the JSON summary

``miniserve.agent_eval`` only starts a chord (cases in the ``agent`` queue, then
``miniserve.agent_eval_summary``) and returns its id, so it never blocks a worker slot
waiting for other tasks. ``python -m bench.evaluate_agent --celery`` calls :func:`fan_out`
and collects the group itself, with a progress bar.
"""
from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

from celery import chord, group
from celery.result import GroupResult

from agent.evaluation import Case, load_cases, run_case, summarize
from core.methods import BATCHED_METHOD, CUSTOM_CACHE
from core.priorities import BATCH, rank
from worker.app import app
from worker.tasks import WorkerGenerator
from worker.runtime import runtime

EVAL_CASE = "miniserve.agent_eval_case"
EVAL_SUMMARY = "miniserve.agent_eval_summary"
EVAL_START = "miniserve.agent_eval"
QUEUE = "agent"


@functools.lru_cache(maxsize=1)
def _registry():
    from tools import create_default_registry

    return create_default_registry()


@app.task(name=EVAL_CASE)
def evaluate_case(case: dict[str, Any], max_steps: int = 3, max_new_tokens: int = 128) -> dict[str, Any]:
    """Run one case on this worker's engine; returns the judged record (with trace)."""
    from agent.model import EngineChatModel

    rt = runtime()
    method = BATCHED_METHOD if rt.batching else CUSTOM_CACHE
    model = EngineChatModel(WorkerGenerator(rt), method=method, priority=rank(BATCH))  # beside live traffic: last
    return run_case(model, _registry(), Case.from_dict(case), max_steps, max_new_tokens)


@app.task(name=EVAL_SUMMARY)
def summarize_records(records: list[dict[str, Any]], output: str | None = None) -> dict[str, Any]:
    """Chord callback: the JSON summary (and, with ``output``, the CSV/JSON/PNG files)."""
    summary = summarize(records)
    summary["run"] = {"mode": "celery", "cases": len(records)}
    if output:
        from agent.eval_report import write_outputs

        summary["paths"] = {k: str(v) for k, v in write_outputs(records, summary, Path(output)).items()}
    return summary


@app.task(name=EVAL_START)
def start_evaluation(categories: list[str] | None = None, limit: int | None = None, output: str | None = None,
                     max_steps: int = 3, max_new_tokens: int = 128) -> str:
    """Start the chord and return its id (the id of the summary task)."""
    cases = load_cases(categories=categories, limit=limit)
    header = [evaluate_case.s(c.to_dict(), max_steps, max_new_tokens).set(queue=QUEUE) for c in cases]
    result = chord(header)(summarize_records.s(output).set(queue=QUEUE))
    return result.id


def fan_out(cases: list[dict[str, Any]], max_steps: int, max_new_tokens: int) -> GroupResult:
    """Send one task per case as a group; the caller collects ``.get()``."""
    job = group(evaluate_case.s(c, max_steps, max_new_tokens).set(queue=QUEUE) for c in cases)
    return job.apply_async()
