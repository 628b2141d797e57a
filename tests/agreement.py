"""Agreement measures for results that are not bit-identical across kernels.

float32 results are compared for identity. bf16 and quantized results may round otherwise on
another CPU (torch's AVX-512, AVX2 or default kernels, oneDNN with or without bf16 instructions,
our C kernels' vector paths), so the tests compare them against a floor: a real bug (a wrong
position, a stale cache, a bad layout) lands far below it, a rounding difference does not.
"""
from __future__ import annotations

import torch


def common_prefix(a: list[int], b: list[int]) -> int:
    """How many leading tokens two greedy runs share (after a flipped near-tie they part)."""
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def top1_agreement(a: torch.Tensor, b: torch.Tensor) -> float:
    """Fraction of rows of two [rows, vocab] logit tensors whose argmax is the same token."""
    return (a.argmax(-1) == b.argmax(-1)).float().mean().item()


def ulps_apart(a: torch.Tensor, b: torch.Tensor) -> int:
    """Largest distance in bf16 steps between equal-shaped bf16 tensors."""
    return int((a.view(torch.int16).int() - b.view(torch.int16).int()).abs().max())


def equal_fraction(a: torch.Tensor, b: torch.Tensor) -> float:
    """Fraction of elements that are bit for bit the same."""
    return (a == b).float().mean().item()
