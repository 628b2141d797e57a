"""llama.cpp's own ``llama-server`` as a mode of ``bench.queue_overhead --served``.

The binary is not part of the project: it is built from llama.cpp's sources (the sdist of
``llama-cpp-python`` holds them; cmake builds ``build/bin/llama-server``) and named by
``--llama-server PATH`` or ``MINISERVE_LLAMA_SERVER``. It serves the bundled default
model's GGUF (the same file our default model is prepared from) with continuous batching,
the same streaming chats as ours, greedy, through its OpenAI route.

At its best at each concurrency: a server with one slot per client (``-np N --cont-batching``,
1,024 tokens of context each), started afresh when the run's client count changes and warmed
by one round before it is measured. One server sized for the largest run is slower at the
smaller ones (measured: 61 against 85 tok/s at 8 clients with 32 slots against 8); fewer slots
than clients would queue clients that our worker batches.
"""
from __future__ import annotations

import contextlib
import os
import subprocess
import tempfile
from pathlib import Path
from typing import Any, Iterator

import requests

CONTEXT_PER_SLOT = 1024
REPETITION_PENALTY = 1.1  # the bundled default model's own (engine/prepare_default.py)
ENV = "MINISERVE_LLAMA_SERVER"


def binary(flag: str) -> str:
    """The llama-server path from the flag or the environment; a clear error when missing."""
    path = flag or os.environ.get(ENV, "")
    if not path or not Path(path).is_file() or not os.access(path, os.X_OK):
        raise SystemExit(f"llama-server not found at {path!r}: pass --llama-server PATH or set {ENV}")
    return path


def argv(path: str, gguf: Path, port: int, threads: int, slots: int) -> list[str]:
    return [path, "-m", str(gguf), "--host", "127.0.0.1", "--port", str(port), "-t", str(threads),
            "-np", str(slots), "--cont-batching", "-c", str(slots * CONTEXT_PER_SLOT), "--no-webui"]


class LlamaServer:
    """One llama-server process at a time, restarted with ``slots`` = the next run's clients."""

    def __init__(self, path: str, threads: int, rounds: int, new_tokens: int) -> None:
        from bench.quantization_llamacpp import gguf_path
        from core.settings import load_settings

        self.path, self.threads, self.rounds, self.new_tokens = binary(path), threads, rounds, new_tokens
        self.gguf = gguf_path(load_settings().cache_dir)
        self.log = open(Path(tempfile.mkdtemp(prefix="miniserve-llama-")) / "llama-server.log", "ab")
        self.proc: subprocess.Popen | None = None
        self.slots = 0
        self.client: Any = None

    def ready_for(self, clients: int, mode: Any) -> None:
        """Serve with one slot per client, warmed; ``mode.processes`` names the live pid."""
        if clients == self.slots:
            return
        from bench.served_clients import openai_client, run_clients
        from tests.harness.stack import free_port, wait_until

        self.stop()
        port = free_port()
        self.proc = subprocess.Popen(argv(self.path, self.gguf, port, self.threads, clients),
                                     stdout=self.log, stderr=subprocess.STDOUT)
        base_url = f"http://127.0.0.1:{port}"
        wait_until(lambda: server_healthy(base_url), 300, what="llama-server")
        # greedy as ours, with the penalty ours applies by default (the model's 1.1, over the whole
        # context: a slot's length; this llama-server refuses -1 with a 400)
        self.client = openai_client(base_url, "default", self.new_tokens,
                                    extra={"repeat_penalty": REPETITION_PENALTY, "repeat_last_n": CONTEXT_PER_SLOT})
        self.slots = clients
        run_clients(clients, 1, self.client)  # warm: the slots' buffers and the thread team
        mode.processes = {"llama-server": self.proc.pid}

    def stop(self) -> None:
        if self.proc is None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self.proc, self.slots = None, 0


@contextlib.contextmanager
def llama_mode(path: str, threads: int, rounds: int, new_tokens: int) -> Iterator[Any]:
    """Yield the ``llama`` :class:`bench.served_clients.Mode`; its server starts with the first run."""
    from bench.served_clients import Mode, run_clients

    server = LlamaServer(path, threads, rounds, new_tokens)
    mode = Mode("llama", lambda n: run_clients(n, rounds, server.client))
    mode.prepare = lambda n: server.ready_for(n, mode)
    try:
        yield mode
    finally:
        server.stop()
        server.log.close()


def server_healthy(base_url: str) -> bool:
    try:
        return requests.get(f"{base_url}/health", timeout=2).status_code == 200
    except requests.RequestException:
        return False
