"""Quantize the hand-written forward's projections once at load, per a precision plan.

``quantize_model(model, setting)`` (called by :func:`engine.loader.load_model`) arranges the
weights as the forward reads them (:func:`engine.weights.fuse_projections`: fused q/k/v and
gate/up), turns each projection and ``lm_head`` into a :class:`QuantizedLinear` in the
format its :class:`~engine.quant.plan.QuantPlan` names, and keeps the result on the model.
:func:`forward_weights` hands it to the forward (``engine.handwritten.forward_for``), so
every method built on the hand-written forward runs quantized.

Memory: the full-precision copies of the quantized matrices are then *freed* (the
transformers modules keep empty placeholders), so a quantized worker holds the low-bit
tensors, the embedding and the norms only. ``official`` (transformers ``generate``) stays
available: a forward pre-hook reloads the full-precision weights from the model's
safetensors on its first call (:mod:`engine.quant.restore`), costing that memory only
in a worker that actually runs ``official``. The embedding is not quantized (a decode step
reads one row of it) and is shared by both paths.
"""
from __future__ import annotations

import dataclasses
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from core.logs import log_event
from engine.quant import gguf_blocks, q8
from engine.quant.gguf_linear import BlockEmbedding, BlockLinear
from engine.quant.kernels import check_kernels
from engine.quant.layer import QuantizedEmbedding, QuantizedLinear, quantize_linear
from engine.quant.q8 import GROUP
from engine.quant.plan import CLASSES, PLANS, PROJECTIONS, QUANT_CHOICES, QuantPlan
from engine.packed import PackedLinear, packing_available, release_freed_memory
from engine.quant import weight_cache
from engine.quant.restore import free_full_weights, restore_full_weights
from engine.quant.source import StoredWeights
from engine.weights import Linear, Qwen2Weights, fuse_projections

logger = logging.getLogger("miniserve.engine.quant")
ATTR = "miniserve_quantized_weights"  # plain attribute on the transformers model
_PROJECTIONS = PROJECTIONS


@dataclass
class QuantSummary:
    """What quantization did, for logs, ``Engine.info`` and the benchmark."""

    mode: str
    group_size: int | None = None
    layers: int = 0
    quantized_bytes: int = 0  # bytes added by the low-bit tensors (+ biases)
    reference_bytes: int = 0  # bytes of the full-precision weights they stand for
    formats: dict[str, str] = field(default_factory=dict)  # class -> format
    freed_bytes: int = 0  # full-precision bytes released after quantizing
    seconds: float = 0.0
    from_cache: bool = False  # read from a quantized file of an earlier start (engine.quant.weight_cache)


def as_plan(plan: QuantPlan | str) -> QuantPlan:
    if isinstance(plan, str):
        if plan not in PLANS:
            raise ValueError(f"unknown quantization mode {plan!r}; expected one of {', '.join(QUANT_CHOICES)}")
        plan = PLANS[plan]
    return plan


def quantize_weights(weights: Qwen2Weights, plan: QuantPlan | str,
                     source: str | None = None) -> tuple[Qwen2Weights, QuantSummary]:
    """A copy of ``weights`` whose projections and lm_head are :class:`QuantizedLinear` (norms,
    embedding and full-precision tensors shared, not copied). ``source`` (the model folder):
    quantize the stored values (:mod:`engine.quant.source`) rather than the in-memory (bf16) ones."""
    plan = as_plan(plan)
    check_kernels(plan.name, weights.device.type)
    summary = QuantSummary(mode=plan.name, group_size=GROUP, formats={cls: plan.name for cls in CLASSES})
    started = time.perf_counter()

    def convert(projection: Any, name: str, source_weight: torch.Tensor | None) -> QuantizedLinear:
        if not isinstance(projection, Linear):
            raise TypeError(f"{name} is {type(projection).__name__}, not a full-precision Linear")
        weight = projection.weight
        if source_weight is not None and source_weight.shape == weight.shape:
            weight = source_weight      # the stored values, not their bf16 rounding (engine.quant.source)
        layer = quantize_linear(weight, projection.bias)
        summary.layers += 1
        summary.quantized_bytes += layer.nbytes
        summary.reference_bytes += projection.weight.numel() * projection.weight.element_size()
        return layer

    with torch.no_grad(), StoredWeights(source) as stored:
        layers = [dataclasses.replace(layer, **{p: convert(getattr(layer, p), f"layers.{i}.{p}", stored.projection(i, p))
                                                for p in PROJECTIONS})
                  for i, layer in enumerate(weights.layers)]
        lm_head = convert(weights.lm_head, "lm_head", stored.tensor("lm_head.weight"))
        embed = _quantized_embed(weights, plan, stored, summary)
    summary.seconds = time.perf_counter() - started
    return dataclasses.replace(weights, layers=layers, lm_head=lm_head, embed=embed), summary


def _quantized_embed(weights: Qwen2Weights, plan: QuantPlan, stored: StoredWeights,
                     summary: QuantSummary) -> Any:
    """The embedding in q8 where the plan asks for it, the table is not tied to lm_head and its
    width splits into groups of 32; else the model's own table."""
    embed = weights.embed
    if plan.embed != "q8" or not isinstance(embed, torch.Tensor) or weights.config.tied or embed.shape[1] % GROUP:
        return embed
    table = stored.tensor("model.embed_tokens.weight")
    table = table if table is not None and table.shape == embed.shape else embed
    embed = QuantizedEmbedding.from_table(table, dtype=embed.dtype)
    summary.quantized_bytes += embed.nbytes
    summary.formats["embed"] = plan.embed
    return embed


def quantize_model(model: Any, mode: QuantPlan | str, free_full: bool = True, source: str | None = None,
                   table_dir: Path | None = None, cache_dir: Path | None = None) -> QuantSummary:
    """Quantize ``model``'s forward weights and keep them on it for :func:`forward_weights`.

    ``free_full`` releases the full-precision matrices afterwards (``official`` reloads them
    from ``source``, the model folder, on first use). ``table_dir``: a quantized embedding
    is kept in a file there and mapped (:meth:`QuantizedEmbedding.mapped`), so only the rows
    in use are resident. ``cache_dir``: the quantized weights are read from a file there when an
    earlier start wrote one for the same folder, plan and CPU path, and written there otherwise
    (:mod:`engine.quant.weight_cache`). ``none`` removes the quantized weights.
    Raises ``ValueError`` for an unknown mode and
    :class:`~engine.quant.kernels.QuantKernelError` when the kernel is missing here."""
    if mode == "none":
        restore_full_weights(model)  # no-op unless a quantized setting freed them
        model.__dict__.pop(ATTR, None)
        return QuantSummary(mode="none")
    plan = as_plan(mode)
    weights = fuse_projections(model)
    # q8 from the folder's stored values: the bundled GGUF's Q5_0 tensors come back exactly and
    # pack in 5 bits (fewer bytes per decode step). With the step's small operations rounding as
    # the bf16 path does (engine.ops) they agree with bf16 above llama.cpp's 0.932 (bench.quantization,
    # docs/quantization.md); before those, the bf16 weights' q8 had agreed better (0.946 vs 0.896).
    quantized, summary = quantized_or_cached(weights, plan, source, cache_dir)
    if table_dir is not None and isinstance(quantized.embed, QuantizedEmbedding):
        quantized = dataclasses.replace(quantized, embed=quantized.embed.mapped(table_dir))
    model.__dict__[ATTR] = quantized  # plain attribute: not a submodule, invisible to transformers
    if free_full:
        summary.freed_bytes = free_full_weights(model, source,
                                                embed=isinstance(quantized.embed, QuantizedEmbedding))
    log_event(logger, "model_quantized", quant=plan.name, group_size=summary.group_size, layers=summary.layers,
              quantized_mb=round(summary.quantized_bytes / 2**20, 1),
              freed_mb=round(summary.freed_bytes / 2**20, 1), latency_ms=int(summary.seconds * 1000),
              formats=summary.formats, from_cache=summary.from_cache)
    return summary


def decide_prefill_paths(weights: Qwen2Weights) -> None:
    """Run the prefill probes (:mod:`engine.quant.prefill_choice`) of the kernels these weights
    use now, at load: otherwise a worker's first prompt waits for them (about 0.3 s for ``q8``
    and 0.08 s per interleaved GGUF format on a 2-core EPYC)."""
    linears = [getattr(layer, name) for layer in weights.layers for name in PROJECTIONS] + [weights.lm_head]
    if weights.dtype == torch.bfloat16 and any(isinstance(linear, QuantizedLinear) for linear in linears):
        q8.decide_prefill_path()   # its GEMM path takes bf16 activations only
    gguf_blocks.decide_prefill_paths(part for linear in linears if isinstance(linear, BlockLinear)
                                     for part in linear.parts if isinstance(part, gguf_blocks.BlockWeight))


def quantized_or_cached(weights: Qwen2Weights, plan: QuantPlan, source: str | None,
                        cache_dir: Path | None) -> tuple[Qwen2Weights, QuantSummary]:
    """:func:`quantize_weights`, or its result as an earlier start wrote it to ``cache_dir``
    (:mod:`engine.quant.weight_cache`; written there on a miss): what a worker's start runs."""
    path = weight_cache.cache_path(cache_dir, plan, source, weights.dtype)
    if path is not None:
        check_kernels(plan.name, weights.device.type)
        started = time.perf_counter()
        hit = weight_cache.read(path, weights)
        if hit is not None:
            quantized, stored = hit
            summary = QuantSummary(**{**stored, "seconds": time.perf_counter() - started, "from_cache": True})
            return quantized, summary
    quantized, summary = quantize_weights(weights, plan, source=source)
    if path is not None:
        weight_cache.write(path, quantized, dataclasses.asdict(summary))
    return quantized, summary


def pack_weights(weights: Qwen2Weights) -> Qwen2Weights:
    """A copy of ``weights`` whose full-precision projections and lm_head are packed (norms and
    the embedding shared); anything that is not a plain :class:`Linear` is kept as it is."""
    def pack(projection):
        return PackedLinear.from_linear(projection) if isinstance(projection, Linear) else projection

    layers = [dataclasses.replace(layer, **{p: pack(getattr(layer, p)) for p in _PROJECTIONS})
              for layer in weights.layers]
    return dataclasses.replace(weights, layers=layers, lm_head=pack(weights.lm_head))


def pack_model(model: Any, source: str | None) -> int:
    """Full precision (``none``): prepack the forward's projections for oneDNN
    (:mod:`engine.packed`: same bits, about twice as fast on CPU) and free the plain copies
    (``official`` reloads them from ``source`` on first use). Returns bytes packed, 0 when
    packing does not apply (not bf16 on a oneDNN CPU, or no source to reload from)."""
    weights = fuse_projections(model)
    if source is None or not packing_available(weights.dtype, weights.device):
        return 0
    started = time.perf_counter()
    with torch.no_grad():
        packed = pack_weights(weights)
    model.__dict__[ATTR] = packed
    freed = free_full_weights(model, source)
    del weights
    release_freed_memory()
    size = sum(getattr(layer, p).nbytes for layer in packed.layers for p in _PROJECTIONS) + packed.lm_head.nbytes
    log_event(logger, "weights_packed", packed_mb=round(size / 2**20, 1), freed_mb=round(freed / 2**20, 1),
              latency_ms=int((time.perf_counter() - started) * 1000))
    return size


def forward_weights(model: Any) -> Qwen2Weights:
    """What the hand-written forward should run: the quantized arrangement when
    :func:`quantize_model` made one, else the model's own (fused) weights."""
    quantized = model.__dict__.get(ATTR)
    return quantized if quantized is not None else fuse_projections(model)


def exact_attention(weights: Qwen2Weights) -> bool:
    """Whether a contiguous cache should round attention as transformers does: full-precision
    weights promise ``official``'s greedy tokens; low-bit weights do not, and take the faster
    one-token decode attention (:func:`engine.ops.torch_ops.grouped_attention`)."""
    return quantized_bytes(weights) == 0


def runs_gguf_blocks(weights: Qwen2Weights) -> bool:
    """Whether some projection or the head runs a GGUF file's own blocks (``gguf``)."""
    linears = [getattr(layer, p) for layer in weights.layers for p in PROJECTIONS] + [weights.lm_head]
    return any(isinstance(linear, BlockLinear) for linear in linears)


def quantized_bytes(weights: Qwen2Weights) -> int:
    """Bytes held by the low-bit projections (and embedding) of ``weights`` (0 when not quantized):
    ``q8``'s, or a GGUF's own blocks."""
    parts = [getattr(layer, p) for layer in weights.layers for p in PROJECTIONS] + [weights.lm_head, weights.embed]
    low_bit = (QuantizedLinear, QuantizedEmbedding, BlockLinear, BlockEmbedding)
    return sum(p.nbytes for p in parts if isinstance(p, low_bit))


def bytes_per_token(weights: Qwen2Weights) -> int:
    """Weight bytes one decode step reads: every projection and lm_head (low-bit tensors or
    full-precision matrices), the norms, one embedding row. The floor of a step's time is
    this over the machine's read bandwidth (``bench.stats.read_bandwidth_gbs``)."""
    def size(t: torch.Tensor | None) -> int:
        return 0 if t is None else t.numel() * t.element_size()

    total = size(weights.norm) + weights.embed.shape[1] * weights.embed.element_size()  # one row
    for proj in [getattr(layer, p) for layer in weights.layers for p in PROJECTIONS] + [weights.lm_head]:
        packed = isinstance(proj, (QuantizedLinear, PackedLinear, BlockLinear))
        total += proj.nbytes if packed else size(proj.weight) + size(proj.bias)
    return total + sum(size(layer.input_norm) + size(layer.post_norm) for layer in weights.layers)
