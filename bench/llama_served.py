"""llama.cpp's own ``llama-server`` as a mode of ``bench.queue_overhead --served``.

The binary is not part of the project: it is built from llama.cpp's sources (the sdist of
``llama-cpp-python`` holds them; cmake builds ``build/bin/llama-server``) and named by
``--llama-server PATH`` or ``MINISERVE_LLAMA_SERVER``. It serves the bundled default
model's GGUF (the same file our default model is prepared from) with continuous batching
over 8 slots (``-np 8 --cont-batching``), the context split between them; the clients are
the same streaming chats as ours, greedy, through its OpenAI route.
"""
from __future__ import annotations

import contextlib
import os
import subprocess
import tempfile
from pathlib import Path
from typing import Iterator

import requests

SLOTS = 8
CONTEXT_PER_SLOT = 1024
REPETITION_PENALTY = 1.1  # the bundled default model's own (engine/prepare_default.py)
ENV = "MINISERVE_LLAMA_SERVER"


def binary(flag: str) -> str:
    """The llama-server path from the flag or the environment; a clear error when missing."""
    path = flag or os.environ.get(ENV, "")
    if not path or not Path(path).is_file() or not os.access(path, os.X_OK):
        raise SystemExit(f"llama-server not found at {path!r}: pass --llama-server PATH or set {ENV}")
    return path


def argv(path: str, gguf: Path, port: int, threads: int) -> list[str]:
    return [path, "-m", str(gguf), "--host", "127.0.0.1", "--port", str(port), "-t", str(threads),
            "-np", str(SLOTS), "--cont-batching", "-c", str(SLOTS * CONTEXT_PER_SLOT), "--no-webui"]


@contextlib.contextmanager
def llama_mode(path: str, threads: int, rounds: int, new_tokens: int) -> Iterator["object"]:
    """Start llama-server on a free port; yield its :class:`bench.queue_served.Mode`."""
    from bench.quantization_llamacpp import gguf_path
    from bench.queue_served import Mode, openai_client, run_clients
    from core.settings import load_settings
    from tests.harness.stack import free_port, wait_until

    gguf = gguf_path(load_settings().cache_dir)
    port = free_port()
    log = open(Path(tempfile.mkdtemp(prefix="miniserve-llama-")) / "llama-server.log", "ab")
    proc = subprocess.Popen(argv(binary(path), gguf, port, threads), stdout=log, stderr=subprocess.STDOUT)
    base_url = f"http://127.0.0.1:{port}"
    try:
        wait_until(lambda: _healthy(base_url), 300, what="llama-server")
        # greedy as ours, with the penalty ours applies by default (the model's 1.1, over the whole
        # context: a slot's length; this llama-server refuses -1 with a 400)
        client = openai_client(base_url, "default", new_tokens,
                               extra={"repeat_penalty": REPETITION_PENALTY, "repeat_last_n": CONTEXT_PER_SLOT})
        yield Mode("llama", lambda n: run_clients(n, rounds, client), {"llama-server": proc.pid})
    finally:
        proc.terminate()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


def _healthy(base_url: str) -> bool:
    try:
        return requests.get(f"{base_url}/health", timeout=2).status_code == 200
    except requests.RequestException:
        return False
