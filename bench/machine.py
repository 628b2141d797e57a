"""What a benchmark records about the machine: CPU model, cores, and measured read bandwidth
(so figures from different hosts can be told apart)."""
from __future__ import annotations

from typing import Any

from bench.stats import cpu_model, machine_info, read_bandwidth_gbs

__all__ = ["cpu_model", "machine_summary", "read_bandwidth_gbs"]


def machine_summary() -> dict[str, Any]:
    return {**machine_info(), "cpu_model": cpu_model(), "read_bandwidth_gbs": read_bandwidth_gbs()}
