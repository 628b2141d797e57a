"""gunicorn's gevent worker, whose own error answers are JSON like every other error.

Why gevent: every open SSE stream used to hold one of gunicorn's gthread threads, so 140
idle streams (or 130 slowloris sockets) starved ``/healthz``. Under this worker a
connection is a greenlet; the process is monkey-patched before the app loads, so
redis-py's blocking ``XREAD`` waits on the hub like a socket read (hiredis only parses
bytes, it does no I/O of its own, so it cannot block the hub). gunicorn's async loop reads
the request line and headers under ``gevent.Timeout(keepalive)``: a client that drips its
headers is dropped after ``MINISERVE_HEADER_TIMEOUT_S``. Bodies: :mod:`web.body`.

gunicorn answers some requests before the application sees them: a request line longer
than ``limit_request_line`` (414), a ``Content-Length`` or header it cannot parse (400),
too many or too large headers (431), a transfer coding it does not implement (501), an
exception that escapes the application (500). It writes those as an HTML page with
``gunicorn.util.write_error``, and offers no hook for the page: ``Worker.handle_error``
looks that function up on the ``util`` module at each call. So this worker, in its own
process only, puts :func:`write_json_error` there (same arguments, same status and
``Connection: close``), and the page becomes ``{"error": {"code", "message"}}``
(``tests/web/test_raw_http.py`` fails if a gunicorn upgrade bypasses it).
"""
from __future__ import annotations

import json
import re
import socket
import warnings
from typing import Any

from gevent.monkey import MonkeyPatchWarning
from gunicorn import util
from gunicorn.workers.ggevent import GeventWorker

CODES = {500: "internal_error"}  # other codes come from the reason phrase ("URI Too Long" -> uri_too_long)


def error_code(status: int, reason: str) -> str:
    return CODES.get(status) or re.sub(r"[^a-z]+", "_", reason.lower()).strip("_") or "error"


def json_error(status: int, reason: str, message: str) -> bytes:
    """The whole HTTP response: status line, headers, MiniServe's JSON error body."""
    body = json.dumps({"error": {"code": error_code(status, reason), "message": message or reason}}).encode()
    head = (f"HTTP/1.1 {status} {reason}\r\nConnection: close\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n")
    return head.encode("latin-1") + body


def write_json_error(sock: socket.socket, status_int: int, reason: str, mesg: str) -> None:
    """Drop-in for ``gunicorn.util.write_error``."""
    util.write_nonblock(sock, json_error(status_int, reason, mesg))


class JsonErrorWorker(GeventWorker):
    """``gevent`` with JSON error pages (see the module docstring)."""

    def init_process(self) -> Any:
        util.write_error = write_json_error
        # gunicorn imports ssl before any worker exists, so the patch always finds it loaded;
        # gevent then patches the module's attributes, which is what redis-py's TLS uses
        # (the only module it lists as unpatched is redis.asyncio, which the web never uses).
        warnings.filterwarnings("ignore", message="Monkey-patching ssl after ssl", category=MonkeyPatchWarning)
        return super().init_process()

    def load_wsgi(self) -> None:
        super().load_wsgi()
        from web.app import warm_up

        warm_up(self.wsgi)
