"""Embedding jobs: a request's inputs -> one fp32 vector each, run on an embedding worker.

The stored request (web/embeddings/submit.py) holds the inputs as ``texts`` (strings) or
``token_ids`` (lists of the model's ids), ``truncate`` and ``model``. The job thread
tokenizes (the tokenizer only reads) and checks each input against the model's longest
input, then hands the ids to the process's one embedding loop
(engine/embedding/batcher.py), where they share forwards with other jobs' inputs, and
waits for its vectors, polling the job's cancel flag and deadline.

The result keeps the vectors as base64 of little-endian float32 (what OpenAI's
``encoding_format: base64`` returns): a quarter of the JSON numbers' size in the job hash;
the web decodes them for ``float`` answers. An input the model cannot take ends the job
``failed`` with a code the web answers as a 400 naming ``input``.
"""
from __future__ import annotations

import base64
import time
from typing import Any

from celery import Task

from core import tasks as names
from core.models import EMBEDDING_QUEUE
from engine.embedding.model import BadTokenId, InputTooLong
from worker.app import app
from worker.celery_state import TASK_THROWS
from worker.job_runner import BadJobRequest, JobContext, JobFailed
from worker.runtime import runtime
from worker.tasks import run_task

INPUT_ERRORS = {InputTooLong: "input_too_long", BadTokenId: "invalid_token_id"}
# Every code above and "unsupported_dimensions": the request's fault, a 400 (web/embeddings/submit.py).


def vector_b64(vector: Any) -> str:
    """One fp32 vector as base64 of its little-endian bytes."""
    return base64.b64encode(vector.numpy().astype("<f4").tobytes()).decode("ascii")


def run_embedding(ctx: JobContext) -> dict[str, Any]:
    rt = runtime()
    stored = ctx.record.request
    loaded_before = rt._engine is not None
    started = time.perf_counter()
    service = rt.engine
    load_ms = 0.0 if loaded_before else (time.perf_counter() - started) * 1000
    texts, ids = stored.get("texts"), stored.get("token_ids")
    if (texts is None) == (ids is None) or not (texts or ids):
        raise BadJobRequest("an embedding request holds texts or token_ids, not both, not none")
    dimensions = service.model.config.dimensions
    if stored.get("dimensions") not in (None, dimensions):
        raise JobFailed("unsupported_dimensions", f"dimensions: this model's vectors have {dimensions} "
                        "dimensions and cannot be shortened (it was not trained for it)", field="dimensions")
    try:
        inputs = service.tokens(texts, ids, bool(stored.get("truncate")))
    except (InputTooLong, BadTokenId) as exc:
        raise JobFailed(INPUT_ERRORS[type(exc)], str(exc), field="input", index=exc.index) from None
    began = time.perf_counter()
    handle = service.submit(inputs)
    vectors = handle.result(should_cancel=ctx.should_cancel)
    tokens = sum(len(one) for one in inputs)
    return {"model": rt.model_id, "embeddings": [vector_b64(v) for v in vectors],
            "dimensions": dimensions,
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
            "timings": {"load_ms": round(load_ms, 2), "embed_ms": round((time.perf_counter() - began) * 1000, 2),
                        "forwards": handle.forwards}}


@app.task(name=names.EMBED, bind=True, throws=TASK_THROWS)
def embed(self: Task, job_id: str, dispatch: int = 0, model: str | None = None) -> dict[str, Any]:
    return run_task(self, job_id, dispatch, run_embedding, names.EMBED, EMBEDDING_QUEUE, model)
