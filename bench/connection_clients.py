"""The hostile half of ``bench.load --connections``: thousands of raw sockets in one thread.

SSE subscribers (held open on running jobs, or cycling over finished ones: connect, replay
to the terminal event, reconnect) and slowloris sockets (headers dripped a byte a second,
or complete headers and a body dripped the same way; each reconnects when the server drops
it, as an attacker would). One ``selectors`` loop drives them all, so the client side costs
one thread however many there are. Runs in its own process (:func:`run_clients`), so its
CPU never sits between the health probe and the server.
"""
from __future__ import annotations

import random
import re
import resource
import selectors
import socket
import time
from dataclasses import dataclass, field
from typing import Any

from core.events import TERMINAL_EVENTS

EVENT_LINE = re.compile(rb"^(id|event): ?(\S+)\r?$", re.M)
DRIP_S = 1.0
SLOW_BODY_LENGTH = 4096


def raise_fd_limit() -> int:
    """The soft file-descriptor limit raised to the hard one; returns the new soft limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


@dataclass
class Subscriber:
    job_id: str
    held: bool  # True: one stream to a running job; False: cycles over a finished job
    seqs: list[int] = field(default_factory=list)
    terminal: str = ""
    status: int = 0
    streams: int = 0  # streams completed (cycling subscribers)
    incomplete: int = 0  # cycling streams that ended without their terminal event
    tail: bytes = b""
    sock: socket.socket | None = None

    def feed(self, data: bytes) -> None:
        text = self.tail + data
        cut = text.rfind(b"\n") + 1
        self.tail = text[cut:]
        if not self.status and text.startswith(b"HTTP/1.1 "):
            self.status = int(text[9:12])
        for name, value in EVENT_LINE.findall(text[:cut]):
            if name == b"id":
                self.seqs.append(int(value))
            elif value.decode() in TERMINAL_EVENTS:
                self.terminal = value.decode()


@dataclass
class Slowloris:
    body: bool  # True: complete headers, body dripped; False: headers dripped
    opened_at: float = 0.0
    next_drip: float = 0.0
    lifetimes: list[float] = field(default_factory=list)  # how long the server let each socket live
    answers: list[int] = field(default_factory=list)  # status codes the server sent before closing
    sock: socket.socket | None = None


def _connect(port: int, request: bytes) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=30)
    sock.sendall(request)
    sock.setblocking(False)
    return sock


def _events_request(job_id: str) -> bytes:
    return f"GET /jobs/{job_id}/events HTTP/1.1\r\nHost: bench\r\nAccept: text/event-stream\r\n\r\n".encode()


def _slow_request(body: bool) -> bytes:
    if not body:
        return b"GET /healthz HTTP/1.1\r\nHost: bench\r\nX-Slow: "
    return (f"POST /jobs HTTP/1.1\r\nHost: bench\r\nContent-Type: application/json\r\n"
            f"Content-Length: {SLOW_BODY_LENGTH}\r\n\r\n{{\"prompt\": \"").encode()


class ClientLoad:
    """All sockets of one run; :meth:`run` drives them until ``stop`` and the held streams end."""

    def __init__(self, port: int, held_jobs: list[str], finished_jobs: list[str], slowloris: int,
                 cycle_pause_s: float) -> None:
        self.port, self.pause = port, cycle_pause_s
        self.selector = selectors.DefaultSelector()
        self.subscribers = [Subscriber(j, True) for j in held_jobs] + [Subscriber(j, False) for j in finished_jobs]
        self.slow = [Slowloris(body=i % 2 == 1) for i in range(slowloris)]
        self.reopen_at: dict[int, float] = {}
        self.open_streams = 0
        self.connect_errors = 0

    def open_all(self) -> None:
        for index, sub in enumerate(self.subscribers):
            self._open_subscriber(index)
        for slow in self.slow:
            self._open_slow(slow)

    def _open_subscriber(self, index: int) -> None:
        sub = self.subscribers[index]
        try:
            sub.sock = _connect(self.port, _events_request(sub.job_id))
        except OSError:
            self.connect_errors += 1
            self.reopen_at[index] = time.monotonic() + self.pause
            return
        sub.tail, sub.status = b"", 0
        if not sub.held:
            sub.seqs, sub.terminal = [], ""
        self.open_streams += 1
        self.selector.register(sub.sock, selectors.EVENT_READ, ("sub", index))

    def _open_slow(self, slow: Slowloris) -> None:
        try:
            slow.sock = _connect(self.port, _slow_request(slow.body))
        except OSError:
            self.connect_errors += 1
            return
        slow.opened_at = slow.next_drip = time.monotonic()
        self.selector.register(slow.sock, selectors.EVENT_READ, ("slow", slow))

    def _close(self, sock: socket.socket) -> None:
        self.selector.unregister(sock)
        sock.close()

    def _on_subscriber(self, index: int) -> None:
        sub = self.subscribers[index]
        try:
            data = sub.sock.recv(65536)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if data:
            sub.feed(data)
        if data and not sub.terminal:
            return
        self._close(sub.sock)
        sub.sock = None
        self.open_streams -= 1
        if not sub.held:
            sub.streams += 1
            sub.incomplete += not sub.terminal
            # browsers do not come back in step: each waits 0.5x to 1.5x the pause
            self.reopen_at[index] = time.monotonic() + self.pause * random.uniform(0.5, 1.5)

    def _on_slow(self, slow: Slowloris) -> None:
        try:
            data = slow.sock.recv(65536)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if data.startswith(b"HTTP/1.1 "):
            slow.answers.append(int(data[9:12]))
        if not data or data.startswith(b"HTTP/1.1 "):
            slow.lifetimes.append(time.monotonic() - slow.opened_at)
            self._close(slow.sock)
            self._open_slow(slow)

    def _drip(self, now: float) -> None:
        for slow in self.slow:
            if slow.sock is not None and now >= slow.next_drip:
                slow.next_drip = now + DRIP_S
                try:
                    slow.sock.send(b"x")
                except OSError:
                    pass  # the server closed it: the read side notices

    def step(self, timeout_s: float = 0.2) -> None:
        for key, _ in self.selector.select(timeout_s):
            kind, what = key.data
            self._on_subscriber(what) if kind == "sub" else self._on_slow(what)
        now = time.monotonic()
        self._drip(now)
        for index, when in list(self.reopen_at.items()):
            if now >= when:
                del self.reopen_at[index]
                self._open_subscriber(index)

    def held_open(self) -> int:
        """Held streams the server answered (200) and has not ended: sockets still in the
        listen backlog do not count."""
        return sum(1 for s in self.subscribers if s.held and s.status == 200 and not s.terminal)

    def answered_streams(self) -> int:
        return sum(1 for s in self.subscribers if s.sock is not None and s.status == 200 and not s.terminal)

    def results(self) -> dict[str, Any]:
        subs = [{"job_id": s.job_id, "held": s.held, "seqs": s.seqs if s.held else [], "terminal": s.terminal,
                 "status": s.status, "streams": s.streams, "incomplete": s.incomplete} for s in self.subscribers]
        slow = [{"body": s.body, "lifetimes": s.lifetimes, "answers": s.answers} for s in self.slow]
        return {"subscribers": subs, "slowloris": slow, "connect_errors": self.connect_errors}


def run_clients(port: int, held_jobs: list[str], finished_jobs: list[str], slowloris: int,
                cycle_pause_s: float, status: Any, stop: Any, out: Any) -> None:
    """Child-process entry: open everything, report open counts in ``status`` (a shared
    array: held streams open, all streams open), run until ``stop`` is set and every held
    stream has ended (or 60 s more), then send :meth:`ClientLoad.results` through ``out``."""
    raise_fd_limit()
    load = ClientLoad(port, held_jobs, finished_jobs, slowloris, cycle_pause_s)
    load.open_all()
    stopped_at = None
    while stopped_at is None or (load.held_open() and time.monotonic() - stopped_at < 60):
        load.step()
        status[0], status[1] = load.held_open(), load.answered_streams()
        if stopped_at is None and stop.is_set():
            stopped_at = time.monotonic()
    out.send(load.results())
