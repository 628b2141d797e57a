"""Quantize the hand-written forward's projections once at load, beside the model's weights.

``quantize_model(model, mode)`` (called by :func:`engine.loader.load_model` when
``MINISERVE_QUANT != none``) arranges the weights as the forward reads them
(:func:`engine.weights.fuse_projections`: fused q/k/v and gate/up, no copy), turns each
projection and ``lm_head`` into a :class:`QuantizedLinear`, and keeps the result on the
model. :func:`forward_weights` hands it to the forward (``engine.handwritten.forward_for``),
so every method built on the hand-written forward runs quantized.

The transformers modules are not touched: ``official`` (transformers ``generate``) keeps
running the unquantized weights and stays the reference. Those weights also serve the
many-rows path of each layer (prefill, big batches), shared, not copied. Memory per setting:
the full-precision model plus the low-bit tensors (docs/quantization.md has the figures).
The embedding is not quantized: a decode step reads one row of it, not the whole matrix.
"""
from __future__ import annotations

import dataclasses
import logging
import time
from dataclasses import dataclass, field
from typing import Any

import torch

from core.logs import log_event
from engine.quant.kernels import check_kernels
from engine.quant.layer import (DEFAULT_GROUP_SIZE, DEFAULT_INT4_LEVELS, DEFAULT_MAX_ROWS, QUANT_MODES,
                                QuantizedLinear, quantize_linear)
from engine.weights import Linear, Qwen2Weights, fuse_projections

logger = logging.getLogger("miniserve.engine.quant")
ATTR = "miniserve_quantized_weights"  # plain attribute on the transformers model
_PROJECTIONS = ("qkv", "o", "gate_up", "down")


@dataclass
class QuantSummary:
    """What quantization did, for logs, ``Engine.info`` and the benchmark."""

    mode: str
    group_size: int | None = None
    layers: int = 0
    quantized_bytes: int = 0  # bytes added by the low-bit tensors (+ biases)
    reference_bytes: int = 0  # bytes of the full-precision weights they stand for
    fallbacks: list[str] = field(default_factory=list)  # int4 projections stored as int8
    seconds: float = 0.0


def quantize_weights(weights: Qwen2Weights, mode: str, group_size: int = DEFAULT_GROUP_SIZE,
                     max_rows: int = DEFAULT_MAX_ROWS, keep_reference: bool = True,
                     lm_head_mode: str | None = None,
                     int4_levels: tuple[int, ...] = DEFAULT_INT4_LEVELS) -> tuple[Qwen2Weights, QuantSummary]:
    """A copy of ``weights`` whose projections and lm_head are :class:`QuantizedLinear`
    (norms, embedding and the full-precision tensors are shared, not copied).
    ``lm_head_mode`` overrides the mode for lm_head alone (e.g. int8 head with int4 layers)."""
    if mode not in QUANT_MODES or mode == "none":
        raise ValueError(f"unknown quantization mode {mode!r}; expected int8 or int4")
    check_kernels(mode, weights.device.type)
    summary = QuantSummary(mode=mode, group_size=group_size if mode == "int4" else None)
    started = time.perf_counter()

    def convert(projection: Any, name: str, as_mode: str = mode) -> QuantizedLinear:
        if not isinstance(projection, Linear):
            raise TypeError(f"{name} is {type(projection).__name__}, not a full-precision Linear")
        layer = quantize_linear(projection.weight, projection.bias, as_mode, group_size=group_size,
                                keep_reference=keep_reference, max_rows=max_rows, int4_levels=int4_levels)
        summary.layers += 1
        summary.quantized_bytes += layer.nbytes
        summary.reference_bytes += projection.weight.numel() * projection.weight.element_size()
        if layer.mode != as_mode:
            summary.fallbacks.append(name)
        return layer

    with torch.no_grad():
        layers = [dataclasses.replace(layer, **{p: convert(getattr(layer, p), f"layers.{i}.{p}")
                                                for p in _PROJECTIONS})
                  for i, layer in enumerate(weights.layers)]
        lm_head = convert(weights.lm_head, "lm_head", lm_head_mode or mode)
    summary.seconds = time.perf_counter() - started
    return dataclasses.replace(weights, layers=layers, lm_head=lm_head), summary


def quantize_model(model: Any, mode: str, group_size: int = DEFAULT_GROUP_SIZE,
                   max_rows: int = DEFAULT_MAX_ROWS) -> QuantSummary:
    """Quantize ``model``'s forward weights and keep them on it for :func:`forward_weights`.

    ``none`` removes them. Raises ``ValueError`` for an unknown mode and
    :class:`~engine.quant.kernels.QuantKernelError` when this torch lacks the kernel."""
    if mode not in QUANT_MODES:
        raise ValueError(f"unknown quantization mode {mode!r}; expected one of {', '.join(QUANT_MODES)}")
    if mode == "none":
        model.__dict__.pop(ATTR, None)
        return QuantSummary(mode="none")
    quantized, summary = quantize_weights(fuse_projections(model), mode, group_size, max_rows)
    model.__dict__[ATTR] = quantized  # plain attribute: not a submodule, invisible to transformers
    log_event(logger, "model_quantized", quant=mode, group_size=summary.group_size, layers=summary.layers,
              quantized_mb=round(summary.quantized_bytes / 2**20, 1), fallbacks=len(summary.fallbacks),
              latency_ms=int(summary.seconds * 1000))
    return summary


def forward_weights(model: Any) -> Qwen2Weights:
    """What the hand-written forward should run: the quantized arrangement when
    :func:`quantize_model` made one, else the model's own (fused) weights."""
    quantized = model.__dict__.get(ATTR)
    return quantized if quantized is not None else fuse_projections(model)


def quantized_bytes(weights: Qwen2Weights) -> int:
    """Bytes held by the low-bit projections of ``weights`` (0 when not quantized)."""
    projections = [getattr(layer, p) for layer in weights.layers for p in _PROJECTIONS] + [weights.lm_head]
    return sum(p.nbytes for p in projections if isinstance(p, QuantizedLinear))
