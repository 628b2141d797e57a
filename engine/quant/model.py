"""Quantize a loaded model's linear layers once at load, beside (not instead of) its weights.

Each ``nn.Linear`` (q/k/v/o, gate/up/down in every layer, and ``lm_head``) gets a plain
attribute ``miniserve_quant`` holding a :class:`QuantizedLinear`. The transformers module
itself is untouched, so ``official`` (transformers ``generate``) stays the unquantized
reference, while the hand-written forward runs each projection through :func:`linear`,
which picks the quantized layer when there is one. The embedding is not quantized: a
decode step reads one row of it, not the whole matrix.

Memory: the quantized tensors come on top of the model's own weights, which stay resident
for ``official`` and for the many-rows path (prefill, big batches); docs/quantization.md
gives the resident sizes per setting.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

from core.logs import log_event
from engine.quant.kernels import check_kernels
from engine.quant.layer import (DEFAULT_GROUP_SIZE, DEFAULT_MAX_ROWS, QUANT_MODES, QuantizedLinear,
                                 quantize_linear)

logger = logging.getLogger("miniserve.engine.quant")
ATTR = "miniserve_quant"  # attribute set on each quantized nn.Linear


@dataclass
class QuantSummary:
    """What quantization did, for logs, ``Engine.info`` and the benchmark."""

    mode: str
    layers: int = 0
    quantized_bytes: int = 0  # bytes added by the low-bit tensors
    reference_bytes: int = 0  # bytes of the full-precision linear weights they stand for
    fallbacks: list[str] = field(default_factory=list)  # int4 layers stored as int8
    seconds: float = 0.0


def quantize_model(model: nn.Module, mode: str, group_size: int = DEFAULT_GROUP_SIZE,
                   max_rows: int = DEFAULT_MAX_ROWS, keep_reference: bool = True) -> QuantSummary:
    """Attach a :class:`QuantizedLinear` to every ``nn.Linear`` of ``model`` (idempotent per
    mode). Raises ``ValueError`` for an unknown mode and ``QuantKernelError`` when this
    torch lacks the kernel."""
    if mode not in QUANT_MODES:
        raise ValueError(f"unknown quantization mode {mode!r}; expected one of {', '.join(QUANT_MODES)}")
    summary = QuantSummary(mode=mode)
    if mode == "none":
        remove_quantization(model)
        return summary
    device = next(model.parameters()).device
    check_kernels(mode, device.type)
    started = time.perf_counter()
    with torch.no_grad():
        for name, module in model.named_modules():
            if not isinstance(module, nn.Linear):
                continue
            layer = quantize_linear(module.weight, module.bias, mode, group_size=group_size,
                                    keep_reference=keep_reference, max_rows=max_rows)
            setattr(module, ATTR, layer)
            summary.layers += 1
            summary.quantized_bytes += layer.nbytes
            summary.reference_bytes += module.weight.numel() * module.weight.element_size()
            if layer.mode != mode:
                summary.fallbacks.append(name)
    summary.seconds = time.perf_counter() - started
    model.miniserve_quant_summary = summary
    log_event(logger, "model_quantized", quant=mode, layers=summary.layers,
              quantized_mb=round(summary.quantized_bytes / 2**20, 1), fallbacks=len(summary.fallbacks),
              latency_ms=int(summary.seconds * 1000))
    return summary


def remove_quantization(model: nn.Module) -> None:
    for module in model.modules():
        module.__dict__.pop(ATTR, None)
    model.__dict__.pop("miniserve_quant_summary", None)


def quantized_layer(module: nn.Module) -> QuantizedLinear | None:
    return module.__dict__.get(ATTR)


def linear(x: torch.Tensor, module: nn.Linear) -> torch.Tensor:
    """``module(x)`` for the hand-written forward: the quantized layer when present."""
    layer = module.__dict__.get(ATTR)
    if layer is not None:
        return layer(x)
    return F.linear(x, module.weight, module.bias)


def linear_op(module: nn.Linear) -> Callable[[torch.Tensor], torch.Tensor]:
    """The callable :func:`linear` would use, resolved once (for forwards that cache ops)."""
    layer = module.__dict__.get(ATTR)
    if layer is not None:
        return layer
    weight, bias = module.weight, module.bias
    return lambda x: F.linear(x, weight, bias)
