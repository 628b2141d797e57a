"""Small helpers shared by the paged/batching benchmarks: machine line, CSV, p50, plots."""
from __future__ import annotations

import os
import platform
from pathlib import Path
from typing import Iterable, Mapping

import torch

from bench.stats import percentile, write_csv  # noqa: F401  (re-exported for the paged benches)

# bench.batching's sampling in every mode, ours and transformers': greedy WITHOUT the model's
# repetition penalty, since transformers' continuous batching drops it ("RepetitionPenaltyLogits
# Processor isn't supported by CB"): with it, our modes and padded `generate` made a
# whole-vocabulary pass per token that hf_cb skipped.
REPETITION_PENALTY = 1.0

RESULTS = Path("results")

# Qwen2.5-0.5B / Qwen2.5-Coder-0.5B K/V geometry (the default model).
DEFAULT_LAYERS, DEFAULT_KV_HEADS, DEFAULT_HEAD_DIM = 24, 2, 64


def machine() -> dict[str, object]:
    return {"cpu_cores": os.cpu_count(), "torch_threads": torch.get_num_threads(),
            "torch": torch.__version__, "python": platform.python_version(),
            "machine": platform.machine()}


def machine_line(dtype: object = "") -> str:
    info = machine()
    extra = f", dtype {dtype}" if dtype else ""
    return (f"machine: {info['cpu_cores']} cores, torch {info['torch']} with "
            f"{info['torch_threads']} threads, python {info['python']}{extra}")


def pct(values: Iterable[float], q: float) -> float:
    """The q-th percentile (linear interpolation), e.g. ``pct(x, 90)``."""
    return percentile(list(values), q)


def p50(values: Iterable[float]) -> float:
    return percentile(list(values), 50)


def print_table(rows: list[Mapping[str, object]]) -> None:
    cols = list(rows[0].keys())
    cells = [[_fmt(row[c]) for c in cols] for row in rows]
    widths = [max(len(c), *(len(r[i]) for r in cells)) for i, c in enumerate(cols)]
    print("  ".join(c.ljust(w) for c, w in zip(cols, widths)))
    for r in cells:
        print("  ".join(v.ljust(w) for v, w in zip(r, widths)))


def _fmt(value: object) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def pyplot():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt
