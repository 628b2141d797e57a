"""The Batch API from the ``celery`` CLI: a JSONL file (or a list of requests) in, the
batch's summary out, through the web's own ``/v1/files`` and ``/v1/batches``::

    celery -A worker call miniserve.batch --args '["/path/in.jsonl"]'
    celery -A worker call miniserve.batch --args '["/path/in.jsonl"]' --kwargs '{"endpoint": "/v1/completions"}'
    celery -A worker result <task id>            # {"batch_id", "summary_task_id", ...}
    celery -A worker result <summary_task_id>    # the batch object once it has ended

Why an HTTP client of the web: a batch's lines are validated by the web's code (its
endpoints' field tables, token counting, limits, prefix routing) and read by a thread of
the web after ``POST /v1/batches`` answers; a worker never imports the web. So the web
must be running, at ``MINISERVE_WEB_URL`` (``make run`` and compose provide it), with
``MINISERVE_WEB_API_KEY`` when the web asks for keys (the batch is then that key's).

``miniserve.batch`` uploads the file, starts the batch (it answers ``validating``) and
returns; ``miniserve.batch_summary`` reads ``GET /v1/batches/{id}`` every few seconds (a
retry, never a blocked worker slot; also while the web does not answer) and returns the
batch once it has ended, output and error file ids included (``GET /v1/files/{id}/content``
serves them).
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import requests

from core.batches import TERMINAL_BATCH_STATES
from core.settings import Settings, get_settings
from worker.app import app

BATCH_START = "miniserve.batch"
BATCH_SUMMARY = "miniserve.batch_summary"
ENDPOINT = "/v1/chat/completions"
POLL_S = 3
QUEUE = "bench"  # like the other long-running control tasks, off the generation queue
TIMEOUT_S = 60  # one call to the web (an upload of up to MINISERVE_MAX_FILE_BYTES included)


class WebRefused(ValueError):
    """The web answered a 4xx or 5xx: its JSON error (``code``, ``param``) in the message."""


def web_url(settings: Settings) -> str:
    """``MINISERVE_WEB_URL``, or the web of this host on ``MINISERVE_PORT``."""
    return (settings.web_url or f"http://127.0.0.1:{settings.port}").rstrip("/")


def _call(method: str, path: str, **kwargs: Any) -> dict[str, Any]:
    settings = get_settings()
    headers = {"Authorization": f"Bearer {settings.web_api_key}"} if settings.web_api_key else {}
    try:
        answer = requests.request(method, web_url(settings) + path, headers=headers, timeout=TIMEOUT_S, **kwargs)
    except requests.ConnectionError:
        raise ConnectionError(f"the web at {web_url(settings)} does not answer (MINISERVE_WEB_URL): the CLI "
                              "batch goes through its /v1/files and /v1/batches") from None
    if answer.status_code >= 400:
        error = (answer.json() if answer.headers.get("content-type", "").startswith("application/json")
                 else {}).get("error") or {}
        raise WebRefused(f"{method} {path}: {answer.status_code} {error.get('code')} "
                         f"(param {error.get('param')}): {error.get('message')}")
    return answer.json()


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
    ``/v1/chat/completions`` (default) or ``/v1/completions`` (the web refuses any other)."""
    filename, text = jsonl_of(source, endpoint)
    stored = _call("POST", "/v1/files", data={"purpose": "batch"}, files={"file": (filename, text.encode("utf-8"))})
    batch = _call("POST", "/v1/batches", json={"input_file_id": stored["id"], "endpoint": endpoint,
                                                "completion_window": "24h", "metadata": metadata})
    summary = summarize_batch.apply_async(args=[batch["id"]], queue=QUEUE, countdown=POLL_S)
    return {"batch_id": batch["id"], "input_file_id": stored["id"], "status": batch["status"],
            "request_counts": batch["request_counts"], "summary_task_id": summary.id}


@app.task(name=BATCH_SUMMARY, bind=True, max_retries=None)
def summarize_batch(self: Any, batch_id: str) -> dict[str, Any]:
    """The batch object once it has ended (the web finalizes it when it is read)."""
    try:
        batch = _call("GET", f"/v1/batches/{batch_id}")
    except ConnectionError:  # the web is restarting: the batch lives in Redis, look again
        raise self.retry(countdown=POLL_S) from None
    if batch["status"] not in TERMINAL_BATCH_STATES:
        raise self.retry(countdown=POLL_S)
    return batch
