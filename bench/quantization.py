"""Benchmark weight-only quantization (``MINISERVE_QUANT``): ``python -m bench.quantization``.

``--kernels``: micro-benchmark of the default model's linear shapes (bf16 / int8 / int4
kernels by rows per matmul), no model needed.
"""
from __future__ import annotations

import argparse
import sys
from dataclasses import asdict
from pathlib import Path

import torch

from bench.stats import machine_info, print_table, write_csv, write_json


def kernels_main(args: argparse.Namespace) -> int:
    from bench.quantization_kernels import model_totals, plot_totals, run_kernels

    rows_list = [int(r) for r in args.rows.split(",")]
    rows = run_kernels(rows_list, args.repeats, args.group_size)
    table = [asdict(r) for r in rows]
    print_table(table, ["shape", "out_features", "in_features", "rows", "mode", "ms_p50", "speedup_vs_bf16"])
    totals = model_totals(rows)
    print()
    print_table(totals, ["rows", "mode", "step_ms", "speedup_vs_bf16"])
    out = Path(args.out)
    write_csv(out / "quant_kernels.csv", table)
    write_csv(out / "quant_kernels_step.csv", totals)
    write_json(out / "quant_kernels_machine.json", {**machine_info(), "group_size": args.group_size,
                                                      "activation_dtype": "bfloat16"})
    plot_totals(totals, out / "quant_kernels.png")
    print(f"\nwrote {out}/quant_kernels.csv, quant_kernels_step.csv, quant_kernels.png")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.quantization", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kernels", action="store_true", help="linear-shape micro-benchmark only")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rows", default="1,2,4,8,12,16,32", help="rows per matmul (--kernels)")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--group-size", type=int, default=64, help="int4 group size")
    parser.add_argument("--out", default="results")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    print(machine_info())
    if args.kernels:
        return kernels_main(args)
    parser.error("the model benchmark is not written yet; use --kernels")
    return 2


if __name__ == "__main__":
    sys.exit(main())
