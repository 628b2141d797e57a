"""The q8 / q5 kernels of the working tree against those of a git revision: ``python -m bench.kernel_ab``.

A kernel change is judged by time per call at the row counts the engine uses (1: decode; 2-9:
a speculative verify step; 8: a batched decode step, one-byte activations; 64: prefill), on
the default model's shapes with the weights streamed from memory as a decode step streams
them: 24 copies of a layer's ``gate_up`` (q5, 9728 x 896) and ``down`` (q8, 896 x 4864),
like the model's 24 layers. Both libraries are compiled here with the same compiler and flags
(``engine.quant.native``), loaded side by side, and timed in interleaved rounds (order
alternating): median time per sweep, the ratio base / working tree, and whether the outputs are
bit-identical (they must be: a kernel change here may only change speed). Writes
``kernel_ab.{json,png}``.
"""
from __future__ import annotations

import argparse
import ctypes
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from bench.stats import finish_plot, machine_info, read_bandwidth_gbs, write_json
from engine.quant import native, q8

LAYERS = 24
SHAPES = {"gate_up q5": (9728, 896, True), "down q8": (896, 4864, False)}  # N, K, five bits
ROWS = (1, 2, 3, 5, 9, 64)
ONE_BYTE_ROWS = (8,)   # a batched decode step: one-byte activations (q8.batched_decode)


def _build_revision(revision: str, directory: Path) -> Path:
    """The kernels' sources as committed at ``revision``, compiled like native.build does."""
    root = Path(__file__).resolve().parents[1]
    files = [*native.SOURCES, *native.HEADERS]
    for path in files:
        relative = path.resolve().relative_to(root)
        text = subprocess.run(["git", "show", f"{revision}:{relative}"], cwd=root, check=True,
                              capture_output=True, text=True).stdout
        (directory / path.name).write_text(text)
    out = directory / "base.so"
    subprocess.run([native._compiler(), *native.FLAGS, "-o", str(out),
                    *(str(directory / p.name) for p in native.SOURCES), "-lm"], check=True)
    return out


def _declare(lib: ctypes.CDLL) -> ctypes.CDLL:
    for kernel in (lib.ms_q8_linear, lib.ms_q5_linear):
        kernel.restype = ctypes.c_int
        kernel.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p,
                           ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int,
                           ctypes.c_int, ctypes.c_int]
    return lib


def _weights(n: int, k: int, five_bits: bool) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """LAYERS copies of one synthetic matrix on a Q5_0 grid (so that it packs in five bits)."""
    generator = torch.Generator().manual_seed(n + k)
    w = torch.randint(-16, 16, (n, k), generator=generator).float() * 0.01
    w[:, ::32] = -0.16
    codes, scales = q8.quantize(w)
    stored = q8.pack5(codes) if five_bits else codes
    return [(stored.clone(), scales.clone()) for _ in range(LAYERS)]


def _sweep(lib: ctypes.CDLL, layers, x: torch.Tensor, out: torch.Tensor, five_bits: bool, precise: bool,
           threads: int) -> None:
    kernel = lib.ms_q5_linear if five_bits else lib.ms_q8_linear
    m, k = x.shape
    for stored, scales in layers:
        status = kernel(x.data_ptr(), 1, m, k, stored.data_ptr(), scales.data_ptr(), out.shape[1], None,
                        out.data_ptr(), 1, threads, int(precise))
        if status != 0:
            raise RuntimeError(f"kernel status {status}")


def measure(libs: dict[str, ctypes.CDLL], rounds: int, threads: int) -> list[dict[str, Any]]:
    rows_out = []
    for shape, (n, k, five_bits) in SHAPES.items():
        layers = _weights(n, k, five_bits)
        cases = [(m, True) for m in ROWS] + [(m, False) for m in ONE_BYTE_ROWS]
        for m, precise in cases:
            x = torch.randn(m, k, generator=torch.Generator().manual_seed(m)).to(torch.bfloat16)
            outs = {name: torch.empty(m, n, dtype=torch.bfloat16) for name in libs}
            times: dict[str, list[float]] = {name: [] for name in libs}
            names = list(libs)
            for name in names:                                   # warm
                _sweep(libs[name], layers, x, outs[name], five_bits, precise, threads)
            for r in range(rounds):
                for name in (names if r % 2 == 0 else names[::-1]):
                    start = time.perf_counter()
                    _sweep(libs[name], layers, x, outs[name], five_bits, precise, threads)
                    times[name].append(time.perf_counter() - start)
            p50 = {name: statistics.median(t) * 1000.0 for name, t in times.items()}
            row = {"matrix": shape, "rows": m, "activations": "two bytes" if precise else "one byte",
                   "base_ms": round(p50["base"], 3), "tree_ms": round(p50["tree"], 3),
                   "speedup": round(p50["base"] / p50["tree"], 3),
                   "identical": bool(torch.equal(outs["base"], outs["tree"]))}
            print(row, flush=True)
            rows_out.append(row)
    return rows_out


def plot(rows: list[dict[str, Any]], path: Path, base: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4))
    labels = [f"{r['rows']}{'*' if r['activations'] == 'one byte' else ''}" for r in rows if r["matrix"] == "down q8"]
    width = 0.4
    for i, matrix in enumerate(SHAPES):
        values = [r["speedup"] for r in rows if r["matrix"] == matrix]
        ax.bar([j + (i - 0.5) * width for j in range(len(values))], values, width, label=f"{LAYERS} x {matrix}")
    ax.axhline(1.0, color="grey", linewidth=0.8)
    ax.set_xticks(range(len(labels)), labels)
    ax.set_xlabel("activation rows per call (* one-byte activations)")
    ax.set_ylabel(f"speedup over {base} (median)")
    ax.set_title("q8 / q5 kernel: working tree against a revision, weights streamed from memory")
    finish_plot(fig, ax, path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", default="HEAD", help="git revision whose kernels are the baseline")
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--out", default="results")
    args = parser.parse_args(argv)
    if native.vector_path() != "avx512-vnni":
        print(f"note: this CPU's vector path is {native.vector_path()}; the figures are that path's")
    with tempfile.TemporaryDirectory() as tmp:
        libs = {"base": _declare(ctypes.CDLL(str(_build_revision(args.base, Path(tmp))))),
                "tree": _declare(native.library())}
        rows = measure(libs, args.rounds, args.threads)
    base = subprocess.run(["git", "rev-parse", "--short", args.base], capture_output=True, text=True).stdout.strip()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    machine = {**machine_info(), "read_bandwidth_gbs": read_bandwidth_gbs(),
               "command": "python -m bench.kernel_ab " + " ".join(argv if argv is not None else sys.argv[1:])}
    write_json(out / "kernel_ab.json", {"machine": machine, "base": base, "threads": args.threads,
                                        "layers": LAYERS, "rows": rows})
    plot(rows, out / "kernel_ab.png", base)
    print(f"wrote {out / 'kernel_ab.json'} and .png")
    return 0 if all(r["identical"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
