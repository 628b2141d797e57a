"""A batch's input file, line by line, into jobs: the same path as the batch's endpoint.

Each line is ``{"custom_id", "method": "POST", "url": <the batch's endpoint>, "body": {...}}``.
Its body is validated by the endpoint's request model (so by its field table), turned into a
job by the same function as its route (``web.openai.batch_endpoints``), and queued by the same
:func:`web.submit.submit` (limits, prefix routing). A line that fails any of these becomes
an *entry* holding its error, for the error file; it never fails the batch. A repeated
``custom_id`` is such an error (the first line with it runs).
"""
from __future__ import annotations

import json
from dataclasses import dataclass, replace
from typing import Any, Iterator

from pydantic import ValidationError

from core.priorities import BATCH
from web.errors import ApiError, validation_details
from web.openai.batch_endpoints import ENDPOINTS
from web.openai.errors import openai_error
from web.submit import Options, submit

MAX_CUSTOM_ID_CHARS = 512


@dataclass(frozen=True)
class Line:
    number: int  # 1-based, as an editor shows it
    custom_id: str | None
    body: dict[str, Any] | None
    error: dict[str, Any] | None  # {"status_code", "code", "message", "param"}


def _bad(number: int, custom_id: str | None, code: str, message: str, param: str | None,
         status: int = 400) -> Line:
    error = {"status_code": status, "code": code, "message": f"line {number}: {message}", "param": param}
    return Line(number, custom_id, None, error)


def parse_line(number: int, text: str, endpoint: str) -> Line:
    """The line's envelope checked (JSON object, ``custom_id``, ``method``, ``url``, ``body``)."""
    try:
        value = json.loads(text)
    except ValueError as exc:
        return _bad(number, None, "invalid_json_line", f"not JSON ({exc})", None)
    if not isinstance(value, dict):
        return _bad(number, None, "invalid_json_line", "not a JSON object", None)
    custom_id = value.get("custom_id")
    if not isinstance(custom_id, str) or not 0 < len(custom_id) <= MAX_CUSTOM_ID_CHARS:
        return _bad(number, None, "invalid_custom_id",
                    f"custom_id: a string of 1 to {MAX_CUSTOM_ID_CHARS} characters is required", "custom_id")
    if value.get("method") != "POST":
        return _bad(number, custom_id, "invalid_method", "method: must be POST", "method")
    if value.get("url") != endpoint:
        return _bad(number, custom_id, "invalid_url", f"url: must be the batch's endpoint {endpoint}", "url")
    if not isinstance(value.get("body"), dict):
        return _bad(number, custom_id, "invalid_body", "body: a JSON object is required", "body")
    unknown = sorted(set(value) - {"custom_id", "method", "url", "body"})
    if unknown:
        return _bad(number, custom_id, "invalid_line", f"{unknown[0]}: unknown field", unknown[0])
    return Line(number, custom_id, value["body"], None)


def split_lines(text: str) -> Iterator[tuple[int, str]]:
    """(number, line) for each line of JSONL, one at a time: no list of 50,000 lines, no
    second copy of a 20 MB text. Lines end at ``\n`` (a ``\r`` before it is dropped), as
    JSONL defines them; a U+2028 inside a JSON string does not end one."""
    number, start = 0, 0
    while start < len(text):
        end = text.find("\n", start)
        end = len(text) if end < 0 else end
        number += 1
        yield number, text[start:end].removesuffix("\r")
        start = end + 1


def _too_large(raw: str, max_line_bytes: int | None) -> bool:
    """Measured in bytes without encoding a line that is plainly short, or plainly long."""
    if max_line_bytes is None or len(raw) <= max_line_bytes // 4:
        return False
    return len(raw) > max_line_bytes or len(raw.encode("utf-8")) > max_line_bytes


def read_lines(text: str, endpoint: str, max_line_bytes: int | None = None) -> Iterator[Line]:
    """Every non-blank line, one at a time, duplicates of an earlier ``custom_id`` marked as
    errors. A line over ``max_line_bytes`` (what one direct request may send,
    ``MINISERVE_MAX_BODY_BYTES``) is an error by its size alone, before it is parsed or its
    text counted: a batch line can cost the web no more than the same call sent alone."""
    seen: dict[str, int] = {}
    for number, raw in split_lines(text):
        if not raw.strip():
            continue
        if _too_large(raw, max_line_bytes):
            yield _bad(number, None, "line_too_large", f"over {max_line_bytes} bytes, the limit of one "
                       "request (MINISERVE_MAX_BODY_BYTES)", None, status=413)
            continue
        line = parse_line(number, raw, endpoint)
        if line.error is None and line.custom_id in seen:
            line = _bad(number, line.custom_id, "duplicate_custom_id",
                        f"custom_id: '{line.custom_id}' is already used on line {seen[line.custom_id]}", "custom_id")
        elif line.error is None:
            seen[line.custom_id] = number
        yield line


def _body_error(line: Line, status: int, code: str, message: str, param: str | None) -> dict[str, Any]:
    return {"custom_id": line.custom_id, "line": line.number,
            "error": {"status_code": 400 if status == 422 else status, "code": code,
                      "message": message, "param": param}}


def submit_line(line: Line, endpoint: str = "/v1/chat/completions", options: Options = Options()) -> dict[str, Any]:
    """The line's entry: its job, or the error a call of ``endpoint`` with its body would
    have answered."""
    if line.error is not None:
        return {"custom_id": line.custom_id, "line": line.number, "error": line.error}
    target = ENDPOINTS[endpoint]
    try:
        body = target.model.model_validate(line.body)
        if getattr(body, "stream", False):
            raise ApiError(400, "validation_error", "stream: not in a batch (results are a file)", field="stream")
        submission = target.job(body).submission
        submission.request.setdefault("priority", BATCH)  # a line waits behind chats unless it asks otherwise
        job = submit(replace(submission, options=options)).job
    except ValidationError as exc:
        first = (validation_details(exc) or [{"field": "body", "message": "invalid"}])[0]
        return _body_error(line, 400, "validation_error", f"{first['field']}: {first['message']}", first["field"])
    except ApiError as exc:
        return _body_error(line, exc.status, exc.code, exc.message, exc.field)
    return {"custom_id": line.custom_id, "line": line.number, "job_id": job.id, "body": line.body}


def error_body(error: dict[str, Any]) -> dict[str, Any]:
    """An entry's error as the body of an OpenAI error answer."""
    return openai_error(int(error["status_code"]), {"error": {"message": error["message"],
                                                              "field": error.get("param"), "code": error["code"]}})
