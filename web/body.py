"""The request body: read whole or refused, parsed once, checked once.

gunicorn hands the application a body shorter than its ``Content-Length`` when the client
closes early, and waits as long as the client likes for the rest; werkzeug then cuts a
chunked body at ``MAX_CONTENT_LENGTH`` without a word (a 2 MB chunked body used to reach
the parser cut short, a 400 ``malformed_json``). So the body is read here, from the WSGI
stream itself: a body that is short, stops arriving for ``MINISERVE_BODY_TIMEOUT_S``, is
still arriving after ``MINISERVE_BODY_DEADLINE_S`` (a client that drips one byte at a time
never trips the per-read timeout) or breaks its chunked framing is a 400 ``incomplete_body``; one over ``MINISERVE_MAX_BODY_BYTES``
is a 413 however it is sent. Nothing later reads the socket again.

The parsed value is kept on the request (:class:`CheckedRequest`): flask-openapi3 asks
``request.get_json`` for it, and would otherwise parse the bytes a second time and, for a
body that is a JSON *string*, parse that string again as the body.
"""
from __future__ import annotations

import io
import socket
from typing import Any

import gevent
from flask import Request
from gunicorn.http.errors import ParseException

from web.errors import ApiError
from web.json_depth import InvalidText, JsonTooDeep, parse_json

READ_STEP = 64 * 1024
_UNPARSED = object()


class CheckedRequest(Request):
    """A request whose ``get_json`` returns the body :func:`load_body` parsed and checked."""

    checked_json: Any = _UNPARSED

    def get_json(self, force: bool = False, silent: bool = False, cache: bool = True) -> Any:
        if self.checked_json is not _UNPARSED:
            return self.checked_json
        return super().get_json(force=force, silent=silent, cache=cache)


def _json_kind(value: Any) -> str:
    """JSON's name for a parsed value's type (a body that is a JSON string holding JSON
    is a string, and stays one)."""
    for kind, name in ((bool, "a boolean"), (str, "a string"), (list, "an array"), ((int, float), "a number")):
        if isinstance(value, kind):
            return name
    return "null"


def _incomplete(message: str) -> ApiError:
    return ApiError(400, "incomplete_body", f"body: {message}", field="body")


def _read(stream: Any, length: int | None, limit: int) -> bytes:
    want = limit + 1 if length is None else length
    parts, got = [], 0
    while got < want:
        piece = stream.read(min(READ_STEP, want - got))
        if not piece:
            break
        parts.append(piece)
        got += len(piece)
    if length is not None and got < length:
        raise _incomplete(f"the connection ended after {got} of its {length} bytes (Content-Length)")
    if got > limit:
        raise ApiError(413, "body_too_large", f"request body over {limit} bytes")
    return b"".join(parts)


def read_body(environ: dict[str, Any], length: int | None, limit: int, idle_timeout_s: float,
              deadline_s: float) -> bytes:
    """The whole body (``length`` bytes, or up to the end of a chunked one), or an
    :class:`ApiError`. Under gunicorn each read waits at most ``idle_timeout_s``, and the
    whole body at most ``deadline_s`` (a ``gevent.Timeout``: it fires in the greenlet that
    reads, which is every request's under the gevent worker; a plain thread, as under
    Flask's test client, has no socket to wait on)."""
    sock = environ.get("gunicorn.socket")
    previous = sock.gettimeout() if isinstance(sock, socket.socket) else None
    if isinstance(sock, socket.socket):
        sock.settimeout(idle_timeout_s)
    deadline = gevent.Timeout(deadline_s)
    deadline.start()
    try:
        data = _read(environ["wsgi.input"], length, limit)
    except gevent.Timeout as exc:
        if exc is not deadline:
            raise
        raise _incomplete(f"the body was still arriving after {deadline_s} s") from None
    except TimeoutError:
        raise _incomplete(f"no bytes arrived for {idle_timeout_s} s") from None
    except ParseException as exc:
        raise _incomplete(f"broken chunked framing ({type(exc).__name__})") from None
    except (OSError, ValueError) as exc:
        raise _incomplete(f"the connection failed while it was read ({type(exc).__name__})") from None
    finally:
        deadline.close()
        if isinstance(sock, socket.socket):
            sock.settimeout(previous)
    environ["wsgi.input"] = io.BytesIO(data)  # for anyone who reads request.data afterwards
    return data


def load_body(request: Request, data: bytes) -> dict[str, Any]:
    """The body as a JSON object, or a 4xx: not JSON (400), nested too deep (400), text
    that is not Unicode (422 naming the field), or JSON that is not an object (422)."""
    try:
        value = parse_json(data)
    except JsonTooDeep as exc:
        raise ApiError(400, "json_too_deep", f"body: {exc}", field="body") from None
    except InvalidText as exc:
        field = exc.field or "body"
        raise ApiError(422, "validation_error", f"{field}: {exc}", field=field) from None
    except ValueError as exc:
        raise ApiError(400, "malformed_json", f"the body is not valid JSON: {exc}") from None
    if not isinstance(value, dict):
        raise ApiError(422, "validation_error", f"body: must be a JSON object, not {_json_kind(value)}",
                       field="body")
    if isinstance(request, CheckedRequest):
        request.checked_json = value
    return value
