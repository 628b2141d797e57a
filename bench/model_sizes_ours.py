"""MiniServe's side of ``python -m bench.models --sizes``: one child process per GGUF file.

The child loads the engine as a worker does (``Engine(settings).load()`` with
``MINISERVE_MODEL`` the file, quantization ``auto``), so its memory is the worker's alone:
``VmHWM`` after the load is the peak while loading; ``VmRSS`` before the model (the imports
alone) is the runtime every worker holds; ``VmRSS`` after a one-token warm-up
(llama-server decodes one before it reports healthy: mapped weights are resident once read)
is the resident memory after load, and the wall time until then is the time to ready. ``--load-only`` stops there
(the first start, on an empty cache folder, is measured that way); ``--batch1-only`` times batch
1 alone (a round of the batch-1 comparison). Otherwise it then times:

- batch 1: the engine's ``custom_cache`` greedy decode tokens/s (median over prompts);
- prompt processing: one 512-token prefill through the engine's forward on a fresh cache;
- batch 8: 8 client threads submitting the same chats as the llama-server side to the engine
  loop (``paged``, as a worker's job threads do), aggregate tokens/s: the median of 3 rounds
  after a warm one, as the llama-server side measures.

It prints one JSON line. The paged pool holds ``--context`` tokens, llama-server's context.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path
from typing import Any

PROMPTS = ("Explain what a hash map is in two sentences.", "Write a Python function that reverses a string.",
           "What is the capital of France?")
PP_TOKENS = 512


def status_mb(pid: int | str = "self") -> dict[str, float]:
    """VmRSS and VmHWM of a process, MB (``/proc/<pid>/status``)."""
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            out[key] = round(int(value.split()[0]) / 1024, 1)
    return out


def load(args: argparse.Namespace) -> tuple[Any, dict[str, Any]]:
    from transformers import AutoConfig, AutoTokenizer  # noqa: F401  (the GGUF load's own imports)

    from core.settings import load_settings
    from engine.engine import Engine

    # what a worker holds before any model (Python, torch, transformers' tokenizer and config
    # classes, the engine), whatever its model: on a small file much of the RSS after load
    runtime = status_mb()["VmRSS"]
    started = time.perf_counter()
    settings = load_settings(model=str(args.gguf), threads=args.threads, cache_dir=args.cache_dir,
                             kv_num_blocks=max(1, args.context // 16), kv_block_size=16)
    engine = Engine(settings)
    engine.load()
    peak = status_mb()["VmHWM"]
    # A first token, as llama-server's warm-up decode before /health answers: weights mapped
    # from a file (ours and its) are resident once a step has read them, not before.
    engine.generate(request(PROMPTS[0], 1))
    ready_s = time.perf_counter() - started
    return engine, {"ready_s": round(ready_s, 2), "rss_after_load_mb": status_mb()["VmRSS"],
                    "rss_runtime_mb": runtime, "peak_load_mb": peak, "setting": engine.loaded.quant}


def request(prompt: str, tokens: int) -> Any:
    from engine.types import GenerationRequest, SamplingParams

    return GenerationRequest(messages=[{"role": "user", "content": prompt}], method="custom_cache",
                             sampling=SamplingParams(max_new_tokens=tokens, temperature=0.0, repetition_penalty=1.0))


def batch1(engine: Any, tokens: int) -> dict[str, Any]:
    engine.generate(request(PROMPTS[0], 4))  # warm-up: first-call allocations and the thread team
    results = [engine.generate(request(p, tokens)) for p in PROMPTS]
    return {"b1_tps": round(statistics.median(r.timings.decode_tokens_per_s for r in results), 2),
            "b1_tokens": [r.usage.completion_tokens for r in results]}


def prompt_processing(engine: Any, repeats: int) -> dict[str, Any]:
    """Tokens/s of a 512-token prefill (median of ``repeats``, after a short warm-up prefill)."""
    import torch

    from engine.handwritten import forward_for
    from engine.kv_cache import ContiguousKVCache

    def one(n: int) -> float:
        def run() -> float:
            forward = forward_for(engine)
            ids = torch.arange(1000, 1000 + n, dtype=torch.long) % forward.config.vocab_size
            cache = ContiguousKVCache(forward.config, n + 1, forward.weights.dtype, forward.weights.device)
            with torch.inference_mode():
                started = time.perf_counter()
                forward(ids, cache)
                return n / (time.perf_counter() - started)
        return engine.loop.call(run)  # on the loop thread: the engine's state has one owner

    one(64)
    return {"pp512_tps": round(statistics.median(one(PP_TOKENS) for _ in range(repeats)), 2)}


def batch8(engine: Any, clients: int, tokens: int) -> dict[str, Any]:
    from bench.queue_served import inproc_client
    from bench.served_clients import median_throughput

    return median_throughput(clients, inproc_client(engine.loop, tokens))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.model_sizes_ours", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gguf", type=Path, required=True)
    parser.add_argument("--cache-dir", type=Path, required=True)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--context", type=int, default=8192, help="paged KV pool, tokens")
    parser.add_argument("--pp-repeats", type=int, default=2)
    parser.add_argument("--load-only", action="store_true")
    parser.add_argument("--batch1-only", action="store_true")
    args = parser.parse_args(argv)
    engine, out = load(args)
    if not args.load_only:
        out.update(batch1(engine, args.tokens))
    if not (args.load_only or args.batch1_only):
        out.update(prompt_processing(engine, args.pp_repeats))
        out.update(batch8(engine, args.clients, args.tokens))
        out["peak_running_mb"] = status_mb()["VmHWM"]
        out["rss_after_runs_mb"] = status_mb()["VmRSS"]
    engine.close()
    print("RESULT " + json.dumps(out), flush=True)
    os._exit(0)  # skip interpreter teardown of the model (seconds, nothing to report)


if __name__ == "__main__":
    raise SystemExit(main())
