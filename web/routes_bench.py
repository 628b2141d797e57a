"""``POST /bench``: benchmark jobs, run on a worker's own engine, results stored as the job result.

Two benchmarks a user can start from the API (the full benchmark commands live in ``bench/``):
``generation_methods`` runs one prompt greedily through every generation method the worker
has and reports their latencies and whether their tokens agree; ``agent_eval`` runs the
agent evaluation cases (optionally some categories, or the first ``limit``) on the worker.
Progress streams as ``progress`` events; the summary is the job's result.
"""
from __future__ import annotations

import logging
from typing import Any, Literal

from flask_openapi3 import APIBlueprint, Tag
from pydantic import Field

from core.logs import log_event
from web.routes_jobs import BODY_ERRORS, GUARD_ERRORS, accepted
from web.schemas import JobAccepted, Strict, json_int
from web.submit import Submission, submit

logger = logging.getLogger("miniserve.web.bench")
api = APIBlueprint("bench", __name__, abp_tags=[Tag(name="bench", description="benchmark jobs")])
DEFAULT_PROMPT = "Explain what a KV cache is in two sentences."
AGENT_CATEGORIES = ("calculator", "retrieval", "direct_answer", "wrong_tool", "multiple_expressions",
                    "irrelevant_retrieval", "tool_error", "malformed_output")


class BenchBody(Strict):
    benchmark: Literal["generation_methods", "agent_eval"]
    prompt: str = Field(default=DEFAULT_PROMPT, min_length=1, max_length=20_000,
                        description="generation_methods: the prompt every method answers (agent_eval ignores it)")
    max_new_tokens: json_int(ge=1, le=256) = Field(default=32)
    categories: list[Literal[AGENT_CATEGORIES]] | None = Field(  # type: ignore[valid-type]
        default=None, max_length=len(AGENT_CATEGORIES),
        description="agent_eval: only these categories (generation_methods ignores it)")
    limit: json_int(ge=1, le=200) | None = Field(
        default=None, description="agent_eval: the first N cases (generation_methods ignores it)")


def from_bench_body(body: BenchBody) -> Submission:
    messages = [{"role": "user", "content": body.prompt}] if body.benchmark == "generation_methods" else []
    request: dict[str, Any] = {"benchmark": body.benchmark, "messages": messages, "prefix": None,
                               "sampling": {"max_new_tokens": body.max_new_tokens},
                               "categories": body.categories, "limit": body.limit}
    return Submission("bench", request, "prompt")


@api.post("/bench", summary="Run a benchmark job on a worker (results stored as the job result)",
          responses={202: JobAccepted, **BODY_ERRORS, **GUARD_ERRORS})
def create_bench_job(body: BenchBody):
    outcome = submit(from_bench_body(body))
    log_event(logger, "bench_submitted", job_id=outcome.job.id, benchmark=body.benchmark)
    return accepted(outcome.job, outcome.replayed)
