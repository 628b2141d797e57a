"""Which precision a setting runs: ``MINISERVE_QUANT`` is ``auto``, ``none``, ``q8`` or ``gguf``.

``q8`` stores every projection, lm_head and the embedding as int8 with an fp16 scale per group
of 32 inputs (llama.cpp's Q8_0 numbers), run by our own C kernel (:mod:`engine.quant.q8`). It
won over the int8 / int4 / mixed plans the project once had on both speed and greedy agreement
with bf16 (``python -m bench.quantization``), so they were removed.

``auto`` picks :data:`AUTO_CPU_PLAN` (``q8``) for a bf16 model on CPU and ``none`` on CUDA or
in float32.

``gguf`` runs a quantized GGUF file on its own blocks (Q4_K, Q6_K, Q5_0...), read from the
mapped file (:mod:`engine.gguf_weights`): no full-precision copy is ever made, so memory is
about the file's size. It is not a :class:`QuantPlan` (nothing is quantized): the loader
takes another path for it. Under ``auto`` it runs the quantized GGUF files whose blocks are
mostly K formats (Q4_K_M and Q5_K_M files of 1.5B and up) or too large for q8's preparation;
see :data:`AUTO_GGUF` and :func:`auto_runs_gguf`.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

PROJECTIONS = ("qkv", "o", "gate_up", "down")
CLASSES = PROJECTIONS + ("lm_head",)


@dataclass(frozen=True)
class QuantPlan:
    name: str
    embed: str = "none"  # "q8": the embedding as int8 in groups of 32 too


PLANS = {
    # the default model's stored Q5_0/Q8_0 GGUF values exactly when quantized from them (source=),
    # within half a step otherwise.
    "q8": QuantPlan("q8", embed="q8"),
}
# ``auto`` picks a low-bit plan on CPU only where it matches llama.cpp's greedy agreement with
# bf16: ``q8`` does (0.995 free-running against llama.cpp's 0.932, results/quantization.json).
# Only for a bf16 model: float32 is an explicit request for full precision (and the tests'
# exact-equality setting).
AUTO_CPU_PLAN = "q8"
GGUF = "gguf"
QUANT_CHOICES = ("auto", "none") + tuple(PLANS) + (GGUF,)
# Whether ``auto`` may run a quantized GGUF on its own bits (CPU, bf16). The loader then still
# leaves to q8 a file whose blocks are mostly 32-input formats and whose q8 preparation fits in
# memory (engine.gguf_weights.auto_declines, with the measured figures).
AUTO_GGUF = True


def auto_runs_gguf(setting: str, device_type: str, dtype: torch.dtype) -> bool:
    """Whether ``setting`` runs a quantized GGUF natively: ``gguf`` always; ``auto`` when
    :data:`AUTO_GGUF` is on, on CPU, for a bf16 model (float32 asks for full precision)."""
    if setting == GGUF:
        return True
    return setting == "auto" and AUTO_GGUF and device_type == "cpu" and dtype == torch.bfloat16


def resolve_quant(setting: str, device_type: str, dtype: torch.dtype = torch.bfloat16) -> str:
    """``auto`` -> :data:`AUTO_CPU_PLAN` for a bf16 model on CPU, ``none`` otherwise (CUDA, or
    float32 asked for); other values as given."""
    if setting not in QUANT_CHOICES:
        raise ValueError(f"MINISERVE_QUANT={setting!r} is not one of {', '.join(QUANT_CHOICES)}")
    if setting == "auto":
        return AUTO_CPU_PLAN if device_type == "cpu" and dtype == torch.bfloat16 else "none"
    return setting
