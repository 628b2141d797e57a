"""What a benchmark records about the machine: CPU model, cores, and measured read bandwidth
(so figures from different hosts can be told apart)."""
from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from bench.stats import machine_info


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown"


def read_bandwidth_gbs(mib: int = 256, repeats: int = 5) -> float:
    """Best-of-``repeats`` GB/s of summing a ``mib`` MiB float32 tensor (a memory read)."""
    import torch

    data = torch.ones(mib * 2**20 // 4, dtype=torch.float32)
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        data.sum()
        best = min(best, time.perf_counter() - start)
    return round(data.numel() * 4 / best / 1e9, 2)


def machine_summary() -> dict[str, Any]:
    return {**machine_info(), "cpu_model": cpu_model(), "read_bandwidth_gbs": read_bandwidth_gbs()}
