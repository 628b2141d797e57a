"""One webhook POST, to an address :mod:`core.webhook_target` checked, never re-resolved.

``http.client`` is used directly: it follows no redirects (a 3xx is a failed try), and its
connection can be pointed at the checked address while the request still names the host
(``Host`` header; for https the TLS server name and certificate check use the host too).
One try has ``timeout_s`` in all, connect to the last byte read; at most ``max_bytes`` of
the answer are read (it only matters that one came).
"""
from __future__ import annotations

import http.client
import socket
import ssl
import time

from core.webhook_target import Target

USER_AGENT = "MiniServe-Webhooks/1"


class _PinnedHTTP(http.client.HTTPConnection):
    def __init__(self, host: str, port: int, address: str, timeout: float) -> None:
        super().__init__(host, port, timeout=timeout)
        self._address = address

    def connect(self) -> None:
        self.sock = socket.create_connection((self._address, self.port), self.timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


class _PinnedHTTPS(http.client.HTTPSConnection):
    def __init__(self, host: str, port: int, address: str, timeout: float) -> None:
        super().__init__(host, port, timeout=timeout, context=ssl.create_default_context())
        self._address = address

    def connect(self) -> None:
        sock = socket.create_connection((self._address, self.port), self.timeout)
        self.sock = self._context.wrap_socket(sock, server_hostname=self.host)


def _left(deadline: float) -> float:
    left = deadline - time.monotonic()
    if left <= 0:
        raise TimeoutError("the webhook try ran out of time")
    return left


def post(target: Target, body: bytes, headers: dict[str, str], timeout_s: float, max_bytes: int) -> int:
    """POST ``body``; returns the HTTP status. Raises OSError / HTTPException when no address
    answers, or TimeoutError past ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    last: Exception | None = None
    for address in target.addresses:
        kind = _PinnedHTTPS if target.scheme == "https" else _PinnedHTTP
        conn = kind(target.host, target.port, address, _left(deadline))
        try:
            conn.connect()
        except OSError as exc:  # this address is down: the next one (each was checked)
            last = exc
            conn.close()
            continue
        try:
            conn.request("POST", target.path, body=body, headers={**headers, "User-Agent": USER_AGENT})
            conn.sock.settimeout(_left(deadline))
            response = conn.getresponse()
            _drain(response, max_bytes, deadline, conn)
            return response.status
        finally:
            conn.close()
    raise last or ConnectionError("no address to connect to")


def _drain(response: http.client.HTTPResponse, max_bytes: int, deadline: float,
           conn: http.client.HTTPConnection) -> None:
    """Read at most ``max_bytes`` of the answer, within the time left."""
    read = 0
    while read < max_bytes:
        if conn.sock is not None:
            conn.sock.settimeout(_left(deadline))
        chunk = response.read1(min(8192, max_bytes - read))
        if not chunk:
            return
        read += len(chunk)
