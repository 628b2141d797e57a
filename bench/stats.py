"""What every benchmark shares: percentiles, the machine it ran on, tables, results paths, plots.

One module, so that each benchmark records its machine and prints its table the same way."""
from __future__ import annotations

import os
from pathlib import Path
import platform
import statistics
from typing import Any, Iterable, Mapping, Sequence

from core.results import write_csv, write_json  # noqa: F401 - re-exported for the benchmarks

RESULTS = Path("results")


def percentile(values: Sequence[float], q: float) -> float:
    """Linear-interpolated percentile (q in 0..100); NaN for no values."""
    data = sorted(values)
    if not data:
        return float("nan")
    pos = (len(data) - 1) * q / 100
    low, high = int(pos), min(int(pos) + 1, len(data) - 1)
    return data[low] + (data[high] - data[low]) * (pos - low)


def p50(values: Iterable[float]) -> float:
    return percentile(list(values), 50)


def summarize(values: Sequence[float]) -> dict[str, float]:
    return {"n": len(values), "mean": statistics.fmean(values) if values else float("nan"),
            "p50": percentile(values, 50), "p90": percentile(values, 90), "p99": percentile(values, 99)}


def last_level_cache_bytes(cache_dir: Path = Path("/sys/devices/system/cpu/cpu0/cache")) -> int:
    """The largest cache the CPU reports (sysfs ``index*/size``: ``32K``, ``480M``), 0 if none.

    A kernel timed over less than this reads from cache, not memory: a cloud VM may report
    hundreds of MB of L3 (a 2-core Xeon here: 480 MB)."""
    units = {"K": 2**10, "M": 2**20, "G": 2**30}
    sizes = []
    for index in cache_dir.glob("index*"):
        try:
            text = (index / "size").read_text().strip()
        except OSError:
            continue
        if text[:-1].isdigit() and text[-1:] in units:
            sizes.append(int(text[:-1]) * units[text[-1]])
        elif text.isdigit():
            sizes.append(int(text))
    return max(sizes, default=0)


def cpu_model() -> str:
    """The CPU's model name (figures differ 2x between machines; ratios hold)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown"


def machine_info() -> dict[str, Any]:
    import importlib.util

    info: dict[str, Any] = {"cpus": os.cpu_count(), "platform": platform.platform(),
                            "python": platform.python_version(), **_cpu(),
                            "last_level_cache_mb": last_level_cache_bytes() // 2**20}
    if importlib.util.find_spec("torch"):
        import torch

        info.update(torch=torch.__version__, torch_threads=torch.get_num_threads(),
                    torch_cpu_capability=torch.backends.cpu.get_cpu_capability())
        try:
            from engine.quant import native

            info["q8_vector_path"] = native.vector_path()
        except Exception as exc:  # no compiler: say so, the figures are still the run's
            info["q8_vector_path"] = f"unavailable: {exc}"
    return info


def machine_summary() -> dict[str, Any]:
    """:func:`machine_info` plus the measured read bandwidth (a decode step's floor), so
    figures from different hosts can be told apart."""
    return {**machine_info(), "read_bandwidth_gbs": read_bandwidth_gbs()}


def machine_line(dtype: object = "") -> str:
    """One printed line: cores, torch and its threads, python (and the dtype, when given)."""
    info = machine_info()
    extra = f", dtype {dtype}" if dtype else ""
    return (f"machine: {info['cpus']} cores, torch {info.get('torch')} with "
            f"{info.get('torch_threads')} threads, python {info['python']}{extra}")


def _cpu() -> dict[str, Any]:
    """The CPU's model name and the vector extensions the kernels care about: an AVX2-only CPU
    runs other kernel paths (and torch other kernels) than an AVX-512 one."""
    try:
        line = next((l for l in Path("/proc/cpuinfo").read_text().splitlines() if l.startswith("flags")), "")
    except OSError:
        line = ""
    flags = set(line.split(":", 1)[-1].split())
    wanted = ("avx2", "fma", "f16c", "avx512f", "avx512_vnni", "avx512_bf16", "amx_bf16")
    return {"cpu_model": cpu_model(), "cpu_flags": [f for f in wanted if f in flags]}


def print_table(rows: Sequence[Mapping[str, Any]], columns: Sequence[str] | None = None) -> None:
    """Rows as aligned columns (``columns`` default: the first row's keys); floats to 4 digits."""
    if not rows:
        return
    columns = list(columns or rows[0].keys())

    def cell(value: Any) -> str:
        return f"{value:.4g}" if isinstance(value, float) else str(value)

    widths = [max(len(c), *(len(cell(r.get(c, ""))) for r in rows)) for c in columns]
    print("  ".join(c.ljust(w) for c, w in zip(columns, widths)))
    for row in rows:
        print("  ".join(cell(row.get(c, "")).ljust(w) for c, w in zip(columns, widths)))


def beyond_cache_mb() -> int:
    """MB a read must cover to come from memory: 512, or twice the largest cache reported."""
    return max(512, 2 * last_level_cache_bytes() // 2**20)


def read_bandwidth_gbs(mb: int | None = None, repeats: int = 7) -> float:
    """The machine's read bandwidth as torch sees it: GB/s of a plain ``sum`` over a
    ``mb``-MB float32 tensor (by default :func:`beyond_cache_mb`), median of ``repeats``, with the
    current torch thread count. The floor of a decode step is its bytes read / this.

    The sums run on the calling thread, which is not the engine loop's: its OpenMP team is
    released afterwards (engine.openmp), or it would slow every engine step that follows in this
    process (a one-row q8 forward: 52 ms instead of 35 on the AVX2 machine)."""
    import time

    import torch

    from engine.openmp import release_thread_team

    data = torch.ones((mb or beyond_cache_mb()) * 2**20 // 4)
    data.sum()
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        data.sum()
        times.append(time.perf_counter() - started)
    release_thread_team()
    return data.numel() * 4 / percentile(times, 50) / 1e9


def pyplot() -> Any:
    """matplotlib's pyplot on the file-only Agg backend (benchmarks run without a display)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt
