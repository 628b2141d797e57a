"""Better int4 rounding: least-squares scale/zero refinement, optionally activation-weighted.

Plain min/max asymmetric int4 wastes levels on a group's extremes. Here each group starts
from the best of a few steps ``(max - min) / L`` (the level search of
:func:`engine.quant.kernels.quantize_int4`), then alternates, HQQ-style, between
(1) the weighted least-squares scale and zero for the current codes and (2) re-rounding
the weights to those, keeping per group the best error seen. ``importance`` (one weight per
input column, e.g. the mean squared activation on a calibration set, AWQ's observation)
makes the error that is minimised the one the layer's outputs see, not the raw weight error.
"""
from __future__ import annotations

import torch

from engine.quant.kernels import KERNEL_DTYPE, _to_bf16_up, quantize_int4


def refine_int4(weight: torch.Tensor, group_size: int, levels: tuple[int, ...] = (15, 14, 13, 12),
                importance: torch.Tensor | None = None, iterations: int = 4) -> tuple[torch.Tensor, torch.Tensor]:
    """Same output as :func:`quantize_int4` (q[N, K] int32, scales_and_zeros[K/g, N, 2] bf16)."""
    n, k = weight.shape
    groups = k // group_size
    w = weight.detach().float().reshape(n, groups, group_size)
    a = torch.ones(k) if importance is None else importance.detach().float().clamp(min=1e-12)
    a = (a / a.mean()).reshape(1, groups, group_size)
    q, params = quantize_int4(weight, group_size, levels)
    q = q.float().reshape(n, groups, group_size)
    scales, zeros = params[..., 0].T.float(), params[..., 1].T.float()  # [N, G]
    best_err = _error(w, q, scales, zeros, a)
    best = (q, scales, zeros)
    for _ in range(iterations):
        s, z = _weighted_fit(w, q - 8.0, a)
        s = _to_bf16_up(s.abs().clamp(min=1e-8)).float()
        z = z.to(KERNEL_DTYPE).float()
        q = (torch.round((w - z[..., None]) / s[..., None]) + 8.0).clamp(0, 15)
        err = _error(w, q, s, z, a)
        better = err < best_err
        best = (torch.where(better[..., None], q, best[0]), torch.where(better, s, best[1]),
                torch.where(better, z, best[2]))
        best_err = torch.minimum(err, best_err)
    q, s, z = best
    packed = torch.stack([s.T, z.T], dim=-1).to(KERNEL_DTYPE).contiguous()
    return q.to(torch.int32).reshape(n, k).contiguous(), packed


def _error(w, q, s, z, a) -> torch.Tensor:
    return (a * ((q - 8.0) * s[..., None] + z[..., None] - w).pow(2)).sum(-1)


def _weighted_fit(w: torch.Tensor, c: torch.Tensor, a: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per group, the (s, z) minimising sum a * (s * c + z - w)^2 (c = codes - 8)."""
    sa = a.sum(-1)
    sc, sw = (a * c).sum(-1), (a * w).sum(-1)
    scc, scw = (a * c * c).sum(-1), (a * c * w).sum(-1)
    det = sa * scc - sc * sc
    safe = det.abs() > 1e-12
    s = torch.where(safe, (sa * scw - sc * sw) / torch.where(safe, det, torch.ones_like(det)), torch.zeros_like(det))
    z = torch.where(safe, (sw - s * sc) / sa, sw / sa)
    return s, z
