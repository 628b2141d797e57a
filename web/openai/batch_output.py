"""A finished batch's output and error files, built from its jobs' stored results.

Output line (OpenAI's format)::

    {"id": "batch_req_<job id>", "custom_id": "...", "error": null,
     "response": {"status_code": 200, "request_id": "<job id>", "body": <chat.completion or text_completion>}}

The error file holds the lines that did not succeed, in the same shape: a body the
endpoint refused (``status_code`` 400 and OpenAI's error body, no job), a job that failed,
timed out or was cancelled (500, 504, 409, naming the job). A line whose envelope could
not be read (not JSON, no ``custom_id``, wrong ``url``) has ``"response": null`` and the
reason in ``error``. Lines keep the input's order.

The answer is shaped from the job record exactly as the endpoint's synchronous route
shapes it (``web.openai.batch_endpoints``), after the line's body is converted again
(tools and tool choice, or echo and logprobs, decide how the text reads).
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from core.events import CANCELLED, EXPIRED, SUCCEEDED, TIMEOUT
from core.jobs import JobNotFound, JobRecord, JobStore
from web.openai.batch_endpoints import ENDPOINTS
from web.openai.batch_lines import error_body
from web.openai.errors import openai_error

STATUS_FOR_JOB_STATE = {CANCELLED: 409, TIMEOUT: 504, EXPIRED: 504}  # any other unsuccessful end: 500
ENVELOPE_CODES = ("invalid_json_line", "invalid_custom_id", "invalid_method", "invalid_url", "invalid_body",
                  "invalid_line")


@dataclass(frozen=True)
class Files:
    output: list[str]
    errors: list[str]


def _line(request_id: str, custom_id: str | None, response: dict[str, Any] | None,
          error: dict[str, Any] | None) -> str:
    return json.dumps({"id": f"batch_req_{request_id}", "custom_id": custom_id, "response": response,
                       "error": error}, ensure_ascii=False)


def _refused(entry: dict[str, Any], index: int, batch_id: str) -> str:
    error = entry["error"]
    request_id = f"{batch_id.removeprefix('batch_')}{index:06d}"
    if error["code"] in ENVELOPE_CODES:
        return _line(request_id, entry["custom_id"], None, {"code": error["code"], "message": error["message"]})
    response = {"status_code": error["status_code"], "request_id": request_id, "body": error_body(error)}
    return _line(request_id, entry["custom_id"], response, None)


def _job_line(entry: dict[str, Any], job: JobRecord | None, model: str, endpoint: str) -> tuple[bool, str]:
    """(succeeded, line) for an entry that became a job (``model``: the answer's model when
    the job does not name one, as in ``/v1/chat/completions``)."""
    job_id = entry["job_id"]
    if job is None:
        error = {"message": "the job's record expired", "field": None, "code": "job_expired"}
        return False, _line(job_id, entry["custom_id"], {"status_code": 500, "request_id": job_id,
                                                         "body": openai_error(500, {"error": error})}, None)
    if job.state == SUCCEEDED:
        body = ENDPOINTS[endpoint].answer(job, entry["body"], job.request.get("model") or model)
        return True, _line(job_id, entry["custom_id"], {"status_code": 200, "request_id": job_id, "body": body}, None)
    status = STATUS_FOR_JOB_STATE.get(job.state, 500)
    raw = job.error or {}
    error = {"message": str(raw.get("message") or raw.get("reason") or job.state), "field": None,
             "code": str(raw.get("code") or f"job_{job.state}")}
    body = openai_error(status, {"error": error})
    return False, _line(job_id, entry["custom_id"], {"status_code": status, "request_id": job_id, "body": body}, None)


def jobs_of(store: JobStore, entries: list[dict[str, Any]]) -> dict[str, JobRecord | None]:
    """The entries' job records (``None``: expired)."""
    out: dict[str, JobRecord | None] = {}
    for entry in entries:
        if "job_id" in entry:
            try:
                out[entry["job_id"]] = store.get(entry["job_id"])
            except JobNotFound:
                out[entry["job_id"]] = None
    return out


def build_files(batch_id: str, entries: list[dict[str, Any]], jobs: dict[str, JobRecord | None],
                model: str, endpoint: str = "/v1/chat/completions") -> Files:
    output, errors = [], []
    for index, entry in enumerate(entries):
        if "job_id" not in entry:
            errors.append(_refused(entry, index, batch_id))
            continue
        ok, line = _job_line(entry, jobs.get(entry["job_id"]), model, endpoint)
        (output if ok else errors).append(line)
    return Files(output, errors)
