"""llama.cpp (llama-cpp-python) on the bundled GGUF: the outside reference of the benchmark.

The benchmark starts this module as a child process (``--serve``) that loads the GGUF once
and answers JSON lines on stdin: ``{"ids": [...], "max_new_tokens": 32}`` -> the greedy
tokens, time to first token and decode tokens/s. A separate process keeps llama.cpp's
threads and memory apart from torch's, and lets the parent interleave it with our settings.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import subprocess
import sys
import time
from pathlib import Path

LLAMA_CPP_PIN = "llama-cpp-python==0.3.36"


def ensure_llama_cpp() -> None:
    """Install the pinned llama-cpp-python when missing (builds from source: minutes)."""
    if importlib.util.find_spec("llama_cpp") is not None:
        return
    print(f"installing {LLAMA_CPP_PIN} (builds from source, a few minutes)...", flush=True)
    subprocess.run([sys.executable, "-m", "pip", "install", LLAMA_CPP_PIN], check=True)


def gguf_path(cache_dir: Path) -> Path:
    """The verified bundled GGUF under ``cache_dir/gguf`` (assembled from the six parts once)."""
    from engine.prepare_default import GGUF_NAME, GGUF_SIZE, assemble_gguf

    target = Path(cache_dir) / "gguf" / GGUF_NAME
    if target.is_file() and target.stat().st_size == GGUF_SIZE:
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_suffix(".partial")
    assemble_gguf(partial, show_progress=False)  # verifies size and sha256
    partial.replace(target)
    return target


def rss_mb() -> float:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


class LlamaClient:
    """The parent's handle on a ``--serve`` child."""

    def __init__(self, gguf: Path, threads: int) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "bench.quantization_llamacpp", "--serve", str(gguf), "--threads", str(threads)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.info = self._read()  # {"ready": true, "rss_mb": ...}

    def _read(self) -> dict:
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError("llama.cpp child exited early")
        return json.loads(line)

    def generate(self, ids: list[int], max_new_tokens: int) -> dict:
        self.proc.stdin.write(json.dumps({"ids": ids, "max_new_tokens": max_new_tokens}) + "\n")
        self.proc.stdin.flush()
        return self._read()

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.close()
            self.proc.wait(timeout=30)


def gguf_bytes_per_token(gguf: str) -> int:
    """Bytes of the GGUF's tensors one decode step reads: all but the token embedding
    (a step reads one row of it). 0 when the ``gguf`` package is missing."""
    try:
        from gguf import GGUFReader
    except ImportError:
        return 0
    return sum(int(t.n_bytes) for t in GGUFReader(gguf).tensors if t.name != "token_embd.weight")


def serve(gguf: str, threads: int) -> None:
    from llama_cpp import Llama

    before = rss_mb()
    llm = Llama(model_path=gguf, n_ctx=2048, n_threads=threads, n_threads_batch=threads,
                n_batch=512, verbose=False)
    print(json.dumps({"ready": True, "rss_before_mb": before, "rss_mb": rss_mb(),
                      "bytes_per_token": gguf_bytes_per_token(gguf)}), flush=True)
    for line in sys.stdin:
        request = json.loads(line)
        tokens, stamps = [], []
        started = time.perf_counter()
        # top_k=1 + temp 0: greedy; no repetition penalty (same as our greedy runs).
        for token in llm.generate(request["ids"], top_k=1, temp=0.0, repeat_penalty=1.0, reset=True):
            stamps.append(time.perf_counter())
            if token in (151645, 151643):
                break
            tokens.append(token)
            if len(tokens) >= request["max_new_tokens"]:
                break
        ttft = stamps[0] - started if stamps else float("nan")
        decode = (len(stamps) - 1) / (stamps[-1] - stamps[0]) if len(stamps) > 1 else float("nan")
        print(json.dumps({"tokens": tokens, "ttft_s": ttft, "decode_tps": decode, "rss_mb": rss_mb()}),
              flush=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--serve", required=True, help="GGUF file")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    serve(args.serve, args.threads)


if __name__ == "__main__":
    main()
