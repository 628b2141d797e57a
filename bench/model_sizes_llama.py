"""llama.cpp's side of ``python -m bench.models --sizes``: its own tools on the same GGUF file.

- ``llama-bench``: prompt processing of 512 tokens (pp512) and text generation at batch 1
  (tg), 3 repetitions averaged, the same thread count; tg alone for a batch-1 round;
- ``llama-server`` as :mod:`bench.llama_served` runs it (one slot per client, 1,024 tokens of
  context each, continuous batching), warmed by one round, then the same 8 streaming chats as
  MiniServe's side, greedy, no repetition penalty: aggregate tokens/s, the median of 3 rounds. Its time to ready is
  from the start of the process to ``/health`` answering 200 (model loaded and warmed), its
  memory ``VmRSS`` then and ``VmHWM`` (the peak while loading) from ``/proc``.
"""
from __future__ import annotations

import json
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.llama_native import batched_tps, version  # noqa: F401 - version: the run records it
from bench.llama_served import server_healthy, argv as server_argv
from bench.model_sizes_ours import status_mb


def _llama_bench(binary: Path, gguf: Path, threads: int, tokens: int, prompt: int) -> list[dict[str, Any]]:
    done = subprocess.run([str(binary / "llama-bench"), "-m", str(gguf), "-p", str(prompt), "-n", str(tokens),
                           "-t", str(threads), "-r", "3", "-o", "json"], capture_output=True, text=True, timeout=1800)
    if done.returncode != 0:
        raise RuntimeError(f"llama-bench exited {done.returncode}: {done.stderr[-400:]}")
    return json.loads(done.stdout)


def bench(binary: Path, gguf: Path, threads: int, tokens: int) -> dict[str, Any]:
    """pp512 and tg tokens/s from one ``llama-bench`` run."""
    entries = _llama_bench(binary, gguf, threads, tokens, 512)
    pp = next(e for e in entries if e["n_prompt"] > 0 and e["n_gen"] == 0)
    tg = next(e for e in entries if e["n_gen"] > 0 and e["n_prompt"] == 0)
    return {"pp512_tps": round(float(pp["avg_ts"]), 2), "b1_tps": round(float(tg["avg_ts"]), 2)}


def text_generation(binary: Path, gguf: Path, threads: int, tokens: int) -> float:
    """tg tokens/s of one ``llama-bench`` run without the pp512 test (a batch-1 round's turn)."""
    return float(_llama_bench(binary, gguf, threads, tokens, 0)[0]["avg_ts"])


def served(binary: Path, gguf: Path, threads: int, tokens: int, clients: int) -> dict[str, Any]:
    """Time to ready, memory, and ``clients`` concurrent chats' tokens/s through llama-server."""
    from bench.queue_served import openai_client
    from bench.served_clients import median_throughput
    from tests.harness.stack import free_port, wait_until

    port = free_port()
    log = open(Path(tempfile.mkdtemp(prefix="miniserve-llama-")) / "llama-server.log", "ab")
    started = time.perf_counter()
    proc = subprocess.Popen(server_argv(str(binary / "llama-server"), gguf, port, threads, clients),
                            stdout=log, stderr=subprocess.STDOUT)
    base_url = f"http://127.0.0.1:{port}"
    try:
        wait_until(lambda: server_healthy(base_url) or proc.poll() is not None, 900, what="llama-server")
        if proc.poll() is not None:
            raise RuntimeError(f"llama-server exited {proc.returncode}; its log: {log.name}")
        out: dict[str, Any] = {"ready_s": round(time.perf_counter() - started, 2)}
        memory = status_mb(proc.pid)
        out.update(rss_after_load_mb=memory["VmRSS"], peak_load_mb=memory["VmHWM"])
        out.update(median_throughput(clients, openai_client(base_url, "default", tokens,
                                                            extra={"repeat_penalty": 1.0})))
        memory = status_mb(proc.pid)
        out.update(rss_after_runs_mb=memory["VmRSS"], peak_running_mb=memory["VmHWM"])
        return out
    finally:
        proc.terminate()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


def measure(binary: Path, gguf: Path, threads: int, tokens: int, clients: int) -> dict[str, Any]:
    """llama-bench's figures, then llama-server's; without a llama-server binary (its build is the
    long part), ``clients`` sequences through ``llama-batched-bench`` instead, and no memory."""
    out = bench(binary, gguf, threads, tokens)
    if (binary / "llama-server").is_file():
        return {**out, **served(binary, gguf, threads, tokens, clients), "batch_via": "llama-server"}
    return {**out, f"b{clients}_tps": round(batched_tps(binary, gguf, clients, tokens, threads), 2),
            "batch_via": "llama-batched-bench (no llama-server binary)"}
