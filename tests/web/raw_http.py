"""HTTP/1.1 over a bare socket, for requests no HTTP client will send: a body shorter than
its Content-Length, a negative length, a request line of 5,000 characters, broken chunks."""
from __future__ import annotations

import json
import socket
import threading
import time
from dataclasses import dataclass, field
from typing import Any


@dataclass
class RawResponse:
    status: int
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes = b""
    elapsed_s: float = 0.0

    def json(self) -> Any:
        return json.loads(self.body)


def request_bytes(method: str, target: str, body: bytes = b"", headers: dict[str, str] | None = None,
                  content_length: int | str | None = None) -> bytes:
    """A request; ``content_length`` overrides the true length (``None``: the true one,
    unless the headers say ``Transfer-Encoding``)."""
    head = {"Host": "test", "Content-Type": "application/json", **(headers or {})}
    if "Transfer-Encoding" not in head:
        head["Content-Length"] = str(len(body) if content_length is None else content_length)
    lines = [f"{method} {target} HTTP/1.1", *(f"{k}: {v}" for k, v in head.items()), "", ""]
    return "\r\n".join(lines).encode("latin-1") + body


def chunked(body: bytes, size: int = 64 * 1024) -> bytes:
    parts = [b"%x\r\n%s\r\n" % (len(body[i:i + size]), body[i:i + size]) for i in range(0, len(body), size)]
    return b"".join(parts) + b"0\r\n\r\n"


def _read_response(sock: socket.socket) -> tuple[bytes, dict[str, str], int]:
    data = b""
    while b"\r\n\r\n" not in data:
        piece = sock.recv(65536)
        if not piece:
            raise ConnectionError(f"closed before a full response head: {data[:200]!r}")
        data += piece
    head, _, rest = data.partition(b"\r\n\r\n")
    status_line, *header_lines = head.decode("latin-1").split("\r\n")
    headers = {}
    for line in header_lines:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    length = int(headers.get("content-length", "-1"))
    while length < 0 or len(rest) < length:
        piece = sock.recv(65536)
        if not piece:
            break
        rest += piece
    return rest if length < 0 else rest[:length], headers, int(status_line.split()[1])


def _send(sock: socket.socket, data: bytes, close_write: bool) -> None:
    try:
        sock.sendall(data)
        if close_write:
            sock.shutdown(socket.SHUT_WR)
    except OSError:  # the server answered (413) and closed before taking it all
        pass


def exchange(port: int, data: bytes, *, close_write: bool = True, timeout_s: float = 20.0) -> RawResponse:
    """Send ``data`` (from a thread: the server may answer before it has read it all), then
    half-close unless ``close_write`` is false (a client that stops sending and waits),
    and read one response."""
    started = time.monotonic()
    with socket.create_connection(("127.0.0.1", port), timeout=timeout_s) as sock:
        sender = threading.Thread(target=_send, args=(sock, data, close_write), daemon=True)
        sender.start()
        body, headers, status = _read_response(sock)
        sender.join(timeout_s)
    return RawResponse(status, headers, body, time.monotonic() - started)
