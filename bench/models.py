"""Decode speed of each bundled model: tokens/s at batch 1 and batch 8, under ``none`` and ``q8``.

Question: how much faster does the second bundled model (SmolLM2-135M) decode than the
default (Qwen2.5-Coder-0.5B), full precision and quantized? Target: under ``q8`` SmolLM2
decodes at least 3x the default model at batch 1.

Each model loads once in bf16 on the CPU (``bench.quantization``'s setup: one hand-written
forward per setting over the same weights). Batch 1 is the engine's ``custom_cache`` greedy
run (its reported decode tokens/s, median over prompts); batch 8 is a plain batched greedy
decode of 8 sequences (:mod:`bench.quantization_batch`).

Beside them, llama.cpp's own native tools on the same GGUF files, at their best: ``llama-bench``
(batch 1, text generation) and ``llama-batched-bench`` (8 parallel sequences), the same thread
count, each file in its own quantization (Q4_K_M for the default model, Q4_1 for SmolLM2).
They are built from the source inside the ``llama-cpp-python`` sdist (docs/benchmarks.md says
how); pass their folder with ``--llama-bin`` or ``MINISERVE_LLAMA_BIN``, or the rows say
"not run".

Run: ``python -m bench.models [--tokens 32] [--threads 2] [--llama-bin DIR] [--out results]``.
``--sizes`` (or ``--size NAME ...``) runs the other question instead, on random-weight files from
0.5B to 8B beside llama.cpp: :mod:`bench.model_sizes` says how.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path
from typing import Any

import torch

from bench.llama_native import llama_rows
from bench.quantization_batch import batched_greedy
from bench.quantization_model import load_engines, plain_request
from bench.stats import machine_info, print_table, write_csv, write_json

MODELS = ("default", "smollm2-135m")
MODES = ("none", "q8")
PROMPTS = ("Explain what a hash map is in two sentences.", "Write a Python function that reverses a string.",
           "What is the capital of France?")


def measure(model: str, args: argparse.Namespace) -> list[dict[str, Any]]:
    """One row per mode for ``model``: decode tokens/s at batch 1 and at ``args.batch``."""
    engines, forwards = load_engines(argparse.Namespace(model=model, threads=args.threads), MODES)
    rows = []
    for mode in MODES:
        engine = engines[mode]
        engine.generate(plain_request(PROMPTS[0], 4))  # warm-up: first-call allocations and thread team
        b1 = [engine.generate(plain_request(p, args.tokens)).timings.decode_tokens_per_s for p in PROMPTS]
        ids = [engine.prompt(plain_request(PROMPTS[i % len(PROMPTS)], 1)).ids for i in range(args.batch)]
        batched = batched_greedy(forwards[mode], ids, args.tokens)
        rows.append({"model": engine.loaded.name, "setting": mode, "decode_tps_b1": statistics.median(b1),
                     f"decode_tps_b{args.batch}": batched["decode_tps"]})
    for engine in engines.values():
        engine.close()
    return rows


def checks(rows: list[dict[str, Any]]) -> dict[str, bool]:
    by = {(r["model"], r["setting"]): r["decode_tps_b1"] for r in rows}
    small, default = by.get(("smollm2-135m-instruct", "q8")), by.get(("qwen2.5-coder-0.5b-instruct", "q8"))
    if small is None or default is None:
        return {}
    return {"q8 smollm2-135m decodes >= 3x the default model at batch 1": small >= 3 * default}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if "--sizes" in argv or "--size" in argv:
        from bench.model_sizes import main as sizes_main

        return sizes_main(argv)
    parser = argparse.ArgumentParser(prog="python -m bench.models", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--tokens", type=int, default=32, help="new tokens per run")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--llama-bin", default=os.environ.get("MINISERVE_LLAMA_BIN", ""),
                        help="folder holding llama-bench and llama-batched-bench (default: $MINISERVE_LLAMA_BIN)")
    parser.add_argument("--out", default="results")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    print(machine_info(), flush=True)
    models = args.models.split(",")
    rows = [row for model in models for row in measure(model, args)]
    llama, llama_note = llama_rows(models, args) if args.llama_bin else ([], "not run: no --llama-bin")
    rows += llama
    by_setting = {(r["setting"]): r["decode_tps_b1"] for r in rows if r["model"].startswith("qwen")}
    for row in rows:
        base = by_setting.get(row["setting"])
        row["b1_vs_default"] = round(row["decode_tps_b1"] / base, 2) if base else ""
    print_table(rows)
    met = checks(rows)
    for name, ok in met.items():
        print(f"target {name}: {'met' if ok else 'NOT met'}")
    out = Path(args.out)
    write_csv(out / "models.csv", rows)
    write_json(out / "models.json", {"machine": machine_info(), "args": vars(args), "rows": rows, "checks": met,
                                     "llama_cpp": llama_note})
    print(f"wrote {out}/models.csv, models.json")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
