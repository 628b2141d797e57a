"""Noticing that the client of a waiting (non-streaming) request has gone away.

A WSGI application only learns of a closed connection when it writes, and a request that
waits for its job writes nothing until the end. Under gunicorn the connection's socket is
in ``environ["gunicorn.socket"]``: while the request waits, the socket is polled once per
wait tick. The client has sent its whole body already (``web.body`` read it), so a socket
that turns readable with nothing to read (``recv(MSG_PEEK)`` of 0 bytes) is a closed
connection; readable *with* bytes is a client pipelining its next request, and stays.
Elsewhere (the Flask test client, another server, TLS sockets) nothing is ever "gone".
"""
from __future__ import annotations

import select
import socket
import ssl
from typing import Any


def client_gone(environ: dict[str, Any]) -> bool:
    sock = environ.get("gunicorn.socket")
    if not isinstance(sock, socket.socket) or isinstance(sock, ssl.SSLSocket):
        return False
    try:
        readable, _, _ = select.select([sock], [], [], 0)
        if not readable:
            return False
        return sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b""
    except (BlockingIOError, InterruptedError):
        return False
    except (OSError, ValueError):  # reset by peer, or already closed
        return True
