"""Benchmark weight-only quantization (``MINISERVE_QUANT``): ``python -m bench.quantization``.

On the real default model, for none and q8, interleaved in one run, with 2 threads:
decode tokens/s at batch 1 (``custom_cache``) and batched (one forward step for ``--batch``
sequences, :mod:`bench.quantization_batch`), time to first token, resident memory of the
loaded model (fresh process per setting, :mod:`bench.quantization_memory`), greedy
agreement with ``none`` over a fixed zh+en prompt set (:mod:`bench.quantization_quality`),
and llama.cpp (llama-cpp-python, installed when missing) on the same GGUF as the outside
reference. Writes ``results/quantization.csv``, ``.json`` and ``.png``.

``--kernels``: micro-benchmark of the default model's linear shapes only (no model).
``--gguf-kernels``: the GGUF block kernels against the read bandwidth (:mod:`bench.gguf_kernels`,
run as ``python -m bench.gguf_kernels``; started here as a child process).
Run real-model benchmarks under ``flock /tmp/miniserve-heavy.lock``.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
from dataclasses import asdict
from pathlib import Path

import torch

from bench.stats import machine_info, print_table, summarize, write_csv, write_json

PROMPTS = [  # fixed set, 4 English + 4 Chinese, each asking for more than 32 tokens
    "Write a Python function that checks whether a number is prime, and explain it.",
    "Explain the difference between a list and a tuple in Python, with examples.",
    "Describe how a hash map works internally, step by step.",
    "Write a short story about a robot who learns to paint.",
    "用中文解释一下什么是机器学习，并举两个例子。",
    "请写一个 Python 函数计算斐波那契数列，并解释它的时间复杂度。",
    "简单介绍一下北京的历史和著名景点。",
    "请用三段话说明为什么要写单元测试。",
]
MODES = ("none", "q8")
DEFAULT_SETTING = "q8"  # the low-bit plan the targets are checked on (auto runs none until one passes them)


def kernels_main(args: argparse.Namespace) -> int:
    from bench.quantization_kernels import model_totals, plot_totals, run_kernels

    rows = run_kernels([int(r) for r in args.rows.split(",")], args.repeats)
    table = [asdict(r) for r in rows]
    print_table(table, ["shape", "out_features", "in_features", "rows", "mode", "ms_p50", "speedup_vs_bf16"])
    totals = model_totals(rows)
    print()
    print_table(totals, ["rows", "mode", "step_ms", "speedup_vs_bf16"])
    out = Path(args.out)
    write_csv(out / "quant_kernels.csv", table)
    write_csv(out / "quant_kernels_step.csv", totals)
    write_json(out / "quant_kernels_machine.json", {**machine_info(), "group_size": 32,
                                                      "activation_dtype": "bfloat16"})
    plot_totals(totals, out / "quant_kernels.png")
    print(f"\nwrote {out}/quant_kernels.csv, quant_kernels_step.csv, quant_kernels.png")
    return 0


def memory_per_setting(args: argparse.Namespace) -> dict[str, dict]:
    """One fresh process per setting, so each RSS reading holds exactly one loaded model."""
    out = {}
    for mode in args.memory_modes.split(","):
        proc = subprocess.run([sys.executable, "-m", "bench.quantization_memory", "--quant", mode,
                               "--threads", str(args.threads), "--model", args.model],
                              capture_output=True, text=True, check=True)
        out[mode] = json.loads(proc.stdout.strip().splitlines()[-1])
        print(f"memory {mode}: {out[mode]}", flush=True)
    return out


def model_main(args: argparse.Namespace) -> int:
    from bench.quantization_model import run_model_benchmark

    memory = {} if args.no_memory else memory_per_setting(args)
    modes = tuple(args.modes.split(","))
    args.default_setting = DEFAULT_SETTING
    result = run_model_benchmark(args, PROMPTS, modes)
    rows = result["rows"]
    for row in rows:
        mem = memory.get(row["setting"]) or {}
        for key in ("model_rss_mb", "quantized_mb", "kv_pool_mb", "worker_mb", "process_rss_mb",
                    "worker_corpus_mb"):
            row[key] = mem.get(key, row.get(key, ""))
    llama = next((r for r in rows if r["setting"] == "llama.cpp"), None)
    if llama:
        llama["worker_mb"] = llama["model_rss_mb"]  # its KV (n_ctx 2048) is allocated and inside
        for row in rows:
            row["memory_vs_llama"] = round(row["worker_mb"] / llama["worker_mb"], 2) if row.get("worker_mb") else ""
            # after every token of a long corpus has been looked up (a mapped embedding's steady state)
            row["corpus_memory_vs_llama"] = (round(row["worker_corpus_mb"] / llama["worker_mb"], 2)
                                             if row.get("worker_corpus_mb") else "")
        default = next((r for r in rows if r["setting"] == DEFAULT_SETTING), None)
        if default and default.get("memory_vs_llama") != "":
            result["checks"][f"{DEFAULT_SETTING} memory <= 1.5x llama.cpp"] = default["memory_vs_llama"] <= 1.5
        if default and default.get("corpus_memory_vs_llama") != "":
            result["checks"][f"{DEFAULT_SETTING} memory after a long corpus <= 1.5x llama.cpp"] = (
                default["corpus_memory_vs_llama"] <= 1.5)
    columns = ["setting", "decode_tps_b1", "speedup_b1", "vs_llama_b1", "pct_of_floor", "ttft_ms",
               "decode_tps_batched", "batched_vs_none", "worker_mb", "memory_vs_llama", "corpus_memory_vs_llama",
               "agree_tf",
               "agree_free", "identical"]
    print()
    print_table(rows, columns)
    checks = result["checks"]
    for name, ok in checks.items():
        print(f"target {name}: {'met' if ok else 'NOT met'}")
    out = Path(args.out)
    write_csv(out / "quantization.csv", rows)
    write_json(out / "quantization.json", {"machine": result["machine"], "args": vars(args), "rows": rows,
                                           "checks": checks, "memory": memory, "samples": result["samples"]})
    from bench.quantization_model import plot

    plot(rows, out / "quantization.png")
    print(f"\nwrote {out}/quantization.csv, quantization.json, quantization.png")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.quantization", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kernels", action="store_true", help="linear-shape micro-benchmark only")
    parser.add_argument("--gguf-kernels", action="store_true", help="GGUF block kernels only (bench.gguf_kernels)")
    parser.add_argument("--model", default="default")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3, help="interleaved rounds (speed)")
    parser.add_argument("--speed-prompts", type=int, default=4, help="prompts per speed round")
    parser.add_argument("--batch", type=int, default=8, help="sequences in the batched decode")
    parser.add_argument("--no-llama", action="store_true", help="skip the llama.cpp reference")
    parser.add_argument("--modes", default=",".join(MODES), help="settings to run (comma-separated)")
    parser.add_argument("--memory-modes", default=f"none,{DEFAULT_SETTING}",
                        help="settings whose resident memory is read, one fresh process each")
    parser.add_argument("--no-memory", action="store_true", help="skip the fresh-process RSS readings")
    parser.add_argument("--rows", default="1,2,4,8,12,16,32", help="rows per matmul (--kernels)")
    parser.add_argument("--out", default="results")
    args = parser.parse_args(argv)
    if args.gguf_kernels:
        return subprocess.call([sys.executable, "-m", "bench.gguf_kernels", "--threads", str(args.threads),
                                "--out", str(Path(args.out) / "gguf_kernels.json")])
    torch.set_num_threads(args.threads)
    print(machine_info(), flush=True)
    if args.kernels:
        return kernels_main(args)
    return model_main(args)


if __name__ == "__main__":
    sys.exit(main())
