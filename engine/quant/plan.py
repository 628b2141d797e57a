"""Per-tensor precision plans: which projection class is stored in which format.

Like llama.cpp's Q4_K_M (which keeps sensitive tensors at 6-8 bits), a plan maps each
projection class of the hand-written forward (``qkv``, ``o``, ``gate_up``, ``down``,
``lm_head``) to a storage format:

- ``int8``: per output row, symmetric (``aten._weight_int8pack_mm``);
- ``int4``: groups of 32, asymmetric, step chosen among a few candidates (level search);
- ``int4-hqq``: the same storage with least-squares scale/zero refinement
  (:mod:`engine.quant.rounding`);
- ``int4-awq``: as ``int4-hqq``, the error weighted per input column by the mean squared
  activation on the calibration set (:mod:`engine.quant.calibration`);
- ``q8``: int8 with an fp16 scale per group of 32 inputs (llama.cpp's Q8_0 numbers), run by
  our own C kernel (:mod:`engine.quant.q8`).

``MINISERVE_QUANT=auto`` picks :data:`AUTO_CPU_PLAN` (``q8``) for a bf16 model on CPU and
``none`` on CUDA or in float32. The choice
of the ``mixed`` plan comes from ``python -m bench.quantization_sensitivity``
(docs/quantization.md has the table).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from engine.quant import kernels, q8
from engine.quant.rounding import refine_int4

PROJECTIONS = ("qkv", "o", "gate_up", "down")
CLASSES = PROJECTIONS + ("lm_head",)
FORMATS = ("int8", "int4", "int4-hqq", "int4-awq", "q8")
INT4_LEVELS = (15, 14, 13, 12)


@dataclass(frozen=True)
class QuantPlan:
    name: str
    default: str  # format of every class not named in ``formats``
    formats: dict[str, str] = field(default_factory=dict)
    group_size: int = 32
    embed: str = "none"  # "int8": int8 rows (QuantizedEmbedding); "q8": int8 in groups of 32

    def format_of(self, cls: str) -> str:
        return self.formats.get(cls, self.default)

    @property
    def needs_calibration(self) -> bool:
        return any(self.format_of(c) == "int4-awq" for c in CLASSES)


PLANS = {
    # qkv and o at int8 (most KL removed per extra byte read, bench.quantization_sensitivity),
    # the rest int4 with activation-aware rounding; embedding as int8 rows (memory only).
    "mixed": QuantPlan("mixed", "int4-awq", {"qkv": "int8", "o": "int8"}, embed="int8"),
    # every projection, lm_head and the embedding as int8 in groups of 32 (our kernel): the
    # default model's stored Q5_0/Q8_0 GGUF values exactly when quantized from them (source=),
    # within half a step otherwise.
    "q8": QuantPlan("q8", "q8", embed="q8"),
    "int8": QuantPlan("int8", "int8"),
    "int4": QuantPlan("int4", "int4"),
}
# ``auto`` picks a low-bit plan on CPU only once it matches llama.cpp's greedy agreement with
# bf16 (issue 12's quality gate). ``q8`` does (0.995 free-running against llama.cpp's 0.932,
# results/quantization.json); ``mixed`` does not (0.631). Only for a bf16 model: float32 is an
# explicit request for full precision (and the tests' exact-equality setting).
AUTO_CPU_PLAN = "q8"
QUANT_CHOICES = ("auto", "none") + tuple(PLANS)


def resolve_quant(setting: str, device_type: str, dtype: torch.dtype = torch.bfloat16) -> str:
    """``auto`` -> :data:`AUTO_CPU_PLAN` for a bf16 model on CPU, ``none`` otherwise (CUDA, or
    float32 asked for); other values as given."""
    if setting not in QUANT_CHOICES:
        raise ValueError(f"MINISERVE_QUANT={setting!r} is not one of {', '.join(QUANT_CHOICES)}")
    if setting == "auto":
        return AUTO_CPU_PLAN if device_type == "cpu" and dtype == torch.bfloat16 else "none"
    return setting


def quantize_for(weight: torch.Tensor, fmt: str, group_size: int = 32,
                 importance: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(codes, params) of ``weight`` in ``fmt``: int8 -> (q int8 [N, K], scales [N]);
    int4* -> (q int32 [N, K] in 0..15, scales_and_zeros [K/g, N, 2])."""
    if fmt == "int8":
        return kernels.quantize_int8(weight)
    if fmt == "q8":
        return q8.quantize(weight)
    if fmt in ("int4-hqq", "int4-awq"):
        return refine_int4(weight, group_size, INT4_LEVELS, importance if fmt == "int4-awq" else None)
    if fmt == "int4":
        return kernels.quantize_int4(weight, group_size, INT4_LEVELS)
    raise ValueError(f"unknown format {fmt!r}; expected one of {FORMATS}")


def quantize_dequantize(weight: torch.Tensor, fmt: str, group_size: int = 32,
                        importance: torch.Tensor | None = None) -> torch.Tensor:
    """The values a format stores for ``weight`` (what the kernel multiplies), in its dtype."""
    if fmt == "none":
        return weight
    if fmt == "int8":
        q, s = quantize_for(weight, fmt)
        return kernels.dequantize_int8(q, s).to(weight.dtype)
    if fmt == "q8":
        q, s = quantize_for(weight, fmt)
        return q8.dequantize(q, s, weight.shape[1]).to(weight.dtype)
    group = kernels.int4_group_size(weight.shape[1], group_size)
    q, p = quantize_for(weight, fmt, group, importance)
    return kernels.dequantize_int4(q, p, group).to(weight.dtype)


def dequantized_image(weights, cls: str, fmt: str, importance: dict | None = None) -> list[torch.Tensor]:
    """Per layer (or ``[lm_head]``), the dequantized weight of class ``cls`` in ``fmt``."""
    imp = (importance or {}).get(cls)
    if cls == "lm_head":
        return [quantize_dequantize(weights.lm_head.weight, fmt, importance=imp)]
    return [quantize_dequantize(getattr(layer, cls).weight, fmt, importance=None if imp is None else imp[i])
            for i, layer in enumerate(weights.layers)]
