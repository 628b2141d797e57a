"""The C operations a forward that must keep torch's bits may still take (``none``, whose greedy
tokens must equal ``official``'s).

Why: ``none``'s linears are oneDNN's, so on CPU its step is the GEMMs plus ~100 small torch
calls, whose cost is dispatch, not arithmetic. Some of those calls C reproduces bit for bit:

- RMSNorm, summing its squares in torch's own order (aten's cascade sum over 8-float vectors:
  its AVX2 and default kernels, and, measured, this torch's AVX-512 build too);
- the rotary embedding (each product and the sum rounded to bf16 where torch rounds);
- the paged K/V write and gather (copies);
- silu(gate) * up, where the C exponential rounds to torch's bf16 silu for every finite bf16
  input (all 65,280 are tried) and the width leaves torch no scalar tail.

Both orders belong to torch's kernels and this CPU, so each is checked once per process on the
model's widths and logged (``exact_c_ops``); a check that fails keeps torch's op. The attention
stays torch's: its softmax sums in another order.
"""
from __future__ import annotations

import functools
import logging
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from engine import fused

logger = logging.getLogger("miniserve.engine.exact_ops")

SUM_LANES = 8          # the vector width whose summation order torch's RMSNorm follows
SILU_ALIGN = 64        # torch's bf16 loop runs 2 vectors of 32 at a time, the rest scalar


@dataclass(frozen=True)
class ExactOps:
    """Which of the operations run in C, each bit-identical to torch's here."""

    norm_rotary: bool = False    # RMSNorm, rotary and the paged K/V gather
    silu: bool = False           # silu(gate) * up

    @property
    def any(self) -> bool:
        return self.norm_rotary or self.silu


NONE = ExactOps()


def exact_ops_for(weights: Any) -> ExactOps:
    """The exact C operations for a full-precision forward over ``weights``: bf16 on CPU with
    the native library loadable, each passing its check for the model's widths."""
    if weights.dtype != torch.bfloat16 or weights.device.type != "cpu":
        return NONE
    from engine.quant.native import NativeBuildError

    try:
        fused._library()
    except NativeBuildError:
        return NONE
    config = weights.config
    return check(config.hidden_size, config.head_dim, config.intermediate_size)


@functools.lru_cache(maxsize=None)
def check(hidden: int, head_dim: int, intermediate: int) -> ExactOps:
    """Both checks for these widths, once per process, logged."""
    ops = ExactOps(norm_rotary=norm_and_rotary_match(hidden, head_dim), silu=silu_matches(intermediate))
    from core.logs import log_event

    log_event(logger, "exact_c_ops", norm_rotary=ops.norm_rotary, silu=ops.silu, hidden=hidden,
              head_dim=head_dim, intermediate=intermediate, cpu_capability=torch.backends.cpu.get_cpu_capability())
    return ops


def _rand(generator: torch.Generator, *shape: int, scale: float = 1.0) -> torch.Tensor:
    return (torch.randn(*shape, generator=generator) * scale).to(torch.bfloat16)


def norm_and_rotary_match(hidden: int, head_dim: int, seeds: int = 12) -> bool:
    """The C RMSNorm (torch's sum order) and rotary against torch's on random bf16 rows."""
    from engine.forward import apply_rotary, rms_norm

    generator = torch.Generator().manual_seed(0)
    for seed in range(seeds):
        x = _rand(generator, 1 + seed % 9, hidden, scale=(0.05, 1.0, 8.0)[seed % 3])
        weight = _rand(generator, hidden)
        if not torch.equal(fused.rms_norm(x, weight, 1e-6, SUM_LANES), rms_norm(x, weight, 1e-6)):
            return False
        rows, heads = 1 + seed % 5, 3
        qk = _rand(generator, rows, heads * head_dim)
        cos, sin = _rand(generator, rows, 1, head_dim), _rand(generator, rows, 1, head_dim)
        want = apply_rotary(qk.view(rows, heads, head_dim), cos, sin)
        try:
            fused.rotary_(qk, heads, head_dim, cos, sin)
        except ValueError:                                   # a head width the C rotary refuses
            return False
        if not torch.equal(qk.view(rows, heads, head_dim), want):
            return False
    return True


def silu_matches(intermediate: int) -> bool:
    """The C silu * up against torch's for every finite bf16 gate value (times a few ``up``
    values), and on random rows of the model's width; only widths torch runs without a scalar
    tail qualify (its tail uses libm's exp, which the C vector path does not reproduce)."""
    if intermediate % SILU_ALIGN:
        return False
    values = torch.arange(65536, dtype=torch.int32).to(torch.int16).view(torch.bfloat16)
    gate = values[torch.isfinite(values.float())]
    gate = gate[: gate.numel() - gate.numel() % SILU_ALIGN]
    for up_value in (1.0, -0.7109375, 3.0):
        up = torch.full_like(gate, up_value)
        if not torch.equal(fused.silu_mul(torch.cat([gate, up])[None]), F.silu(gate[None]).mul_(up[None])):
            return False
    rows = _rand(torch.Generator().manual_seed(1), 3, 2 * intermediate, scale=4.0)
    gate, up = rows.chunk(2, dim=-1)
    return torch.equal(fused.silu_mul(rows), F.silu(gate).mul_(up))
