"""Which small operations a forward runs, decided once from its weights and this CPU; and the
whole-step kernel that goes with them where it applies.

- full-precision weights (``none``), float32, or another device: torch's exact operations
  (:class:`~engine.ops.torch_ops.TorchOps`), which keep ``official``'s greedy tokens;
- low-bit bf16 weights on CPU: the C operations (:mod:`engine.ops.fused_ops`), with the cache
  attention in C where torch runs AVX-512 kernels (:func:`attention_like_torch`) or the weights
  are a GGUF file's own blocks (:func:`attends_in_c`); torch's folded operations when the native
  library cannot be built here (said loudly).

The whole-step kernel (:class:`engine.quant.step.DecodeStep`) runs those same C pieces, in the
same order, for every layer and the head in one call: so where the operations attend in C
and every projection is q8/q5 or GGUF block parts, :func:`whole_step_for` hands it out and the forward takes it
for a step of a few tokens of one sequence. It stays a step-level object rather than a
method of :class:`~engine.ops.interface.SmallOps`: it is built over the whole model's weights
(pointers C keeps) and takes the cache, not one operation's tensors.
"""
from __future__ import annotations

import logging
from typing import Any

import torch

from core.logs import log_event
from engine.ops import c_calls
from engine.ops.fused_ops import CAttentionOps, FusedOps
from engine.ops.interface import SmallOps
from engine.ops.torch_ops import TorchOps
from engine.quant.model import exact_attention, runs_gguf_blocks
from engine.quant.step import DecodeStep

logger = logging.getLogger("miniserve.engine.ops")

# torch CPU capabilities (torch.backends.cpu.get_cpu_capability()) on which the C decode
# attention rounds closely enough to torch's SDPA that q8 keeps its agreement with bf16
# (AVX-512: 0.995 free-running, results/quantization.json). With torch's AVX2 kernels it does
# not, so there the attention stays torch's SDPA and the other small operations run in C.
# Measured again on a 2-core AVX2 EPYC with the C attention forced on (`python -m
# bench.quantization --modes none,q8 --no-memory --repeats 2 --speed-prompts 2`): q8 decoded
# 51.4 tok/s at batch 1 (the one-call step; paired in one process, 44.7 against 35.5 with
# torch's attention) but agreed with bf16 0.896 free-running, 0.991 teacher-forced, below llama.cpp's
# 0.995 on the same file, so the benchmark's agreement check failed. The C attention is not
# less accurate (on random inputs its mean error against a float64 softmax equals SDPA's): it
# rounds elsewhere, and the bf16 model's tokens follow SDPA's rounding.
ATTENTION_LIKE_TORCH = ("AVX512",)


def attention_like_torch() -> bool:
    """Whether a low-bit forward also attends in C on this CPU."""
    return torch.backends.cpu.get_cpu_capability() in ATTENTION_LIKE_TORCH


def attends_in_c(weights: Any) -> bool:
    """Whether a low-bit forward over ``weights`` attends in C, and so may take the whole-step
    kernel. q8 does so only where the C attention rounds like torch's (its promise is agreement
    with the bf16 model, which attends in torch). A GGUF file run on its own blocks is compared
    with llama.cpp on the same file, which attends in neither's order. On an AVX2 CPU the whole
    step this enables decoded 1.2-1.4x faster than the per-linear path (the default model's GGUF,
    a Qwen2.5 1.5B Q4_K_M file), and the default model's teacher-forced agreement with bf16
    stayed where it was (0.986 per-linear, 0.991 in C; ``python -m bench.quantization``)."""
    return attention_like_torch() or runs_gguf_blocks(weights)


def small_ops_for(weights: Any) -> SmallOps:
    """The operations a forward over ``weights`` runs (see the module's docstring)."""
    exact = exact_attention(weights)
    if exact or weights.dtype != torch.bfloat16 or weights.device.type != "cpu":
        return TorchOps(exact=exact)
    reason = c_calls.unavailable()
    if reason is not None:  # no compiler, odd platform: torch's ops instead
        log_event(logger, "fused_ops_unavailable", level=logging.WARNING, reason=reason)
        return TorchOps(exact=False)
    return CAttentionOps() if attends_in_c(weights) else FusedOps()


def whole_step_for(weights: Any, ops: SmallOps) -> DecodeStep | None:
    """The one-call step over ``weights`` where it computes what ``ops`` would: the attention in
    C, and every piece of the model in step.c (:meth:`DecodeStep.supports`); else None."""
    if not ops.c_attention or not DecodeStep.supports(weights):
        return None
    return DecodeStep(weights)
