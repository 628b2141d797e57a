"""The Batch API from the ``celery`` CLI: a JSONL file (or a list of requests) in, the
batch's summary out. The lines go through exactly the web's path (validation by the
field table, limits, prefix routing), run in a web app context built here::

    celery -A worker call miniserve.batch --args '["/path/in.jsonl"]'
    celery -A worker call miniserve.batch --args '["/path/in.jsonl"]' --kwargs '{"endpoint": "/v1/completions"}'
    celery -A worker result <task id>            # {"batch_id", "summary_task_id", ...}
    celery -A worker result <summary_task_id>    # the batch object once it has ended

``miniserve.batch`` only starts the batch; ``miniserve.batch_summary`` looks at it every few
seconds (a retry, never a blocked worker slot) and returns it once it has ended, output and
error file ids included (``GET /v1/files/{id}/content`` serves them).
"""
from __future__ import annotations

import functools
import json
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

from worker.app import app

BATCH_START = "miniserve.batch"
BATCH_SUMMARY = "miniserve.batch_summary"
ENDPOINT = "/v1/chat/completions"
POLL_S = 3
QUEUE = "bench"  # like the other long-running control tasks, off the generation queue


@functools.lru_cache(maxsize=1)
def _web_app() -> Any:
    from web.app import create_app

    return create_app()


@contextmanager
def web_context() -> Iterator[None]:
    """A request context of a web app (no API key: the batch's owner is the CLI's, '')."""
    with _web_app().test_request_context("/v1/batches"):
        yield


def jsonl_of(source: str | list[dict[str, Any]], endpoint: str = ENDPOINT) -> tuple[str, str]:
    """(filename, JSONL) from a path, or from requests: full lines, or bare bodies of
    ``endpoint`` (given ``custom_id`` ``request-<n>``)."""
    if isinstance(source, str):
        return Path(source).name, Path(source).read_text(encoding="utf-8")
    lines = [item if "body" in item else {"custom_id": f"request-{n}", "method": "POST", "url": endpoint,
                                          "body": item} for n, item in enumerate(source)]
    return "requests.jsonl", "".join(json.dumps(line, ensure_ascii=False) + "\n" for line in lines)


@app.task(name=BATCH_START)
def start_batch(source: str | list[dict[str, Any]], metadata: dict[str, str] | None = None,
                endpoint: str = ENDPOINT) -> dict[str, Any]:
    """Upload the requests as a file, start the batch, start its summary task. ``endpoint``:
    ``/v1/chat/completions`` (default) or ``/v1/completions``."""
    from web.openai import batch_flow
    from web.openai.batch_schemas import ENDPOINTS

    if endpoint not in ENDPOINTS:
        raise ValueError(f"endpoint: one of {', '.join(ENDPOINTS)}")
    filename, text = jsonl_of(source, endpoint)
    with web_context():
        stored = batch_flow.batch_store().put_file("batch", filename, text)
        record = batch_flow.start_batch(text, stored.id, endpoint, "24h", metadata, "")
    summary = summarize_batch.apply_async(args=[record.id], queue=QUEUE, countdown=POLL_S)
    return {"batch_id": record.id, "input_file_id": stored.id, "status": record.status,
            "request_counts": record.object["request_counts"], "summary_task_id": summary.id}


@app.task(name=BATCH_SUMMARY, bind=True, max_retries=None)
def summarize_batch(self: Any, batch_id: str) -> dict[str, Any]:
    """The batch object once it has ended (finalizing it if nobody has yet)."""
    from core.batches import TERMINAL_BATCH_STATES
    from web.openai import batch_flow

    with web_context():
        record = batch_flow.refresh(batch_flow.batch_store().get_batch(batch_id))
    if record.status not in TERMINAL_BATCH_STATES:
        raise self.retry(countdown=POLL_S)
    return record.object
