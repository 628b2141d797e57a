"""Full-precision projections with their weights prepacked for oneDNN (issue 12, item 3).

``F.linear`` on a bf16 CPU tensor goes through oneDNN, which first reorders the plain
``[out, in]`` weight into its blocked layout, on every call: a decode step reads (and
writes) every matrix twice. Reordering once at load (``mkldnn._reorder_linear_weight``)
and multiplying with ``mkldnn._linear_pointwise`` gives the *same bits* (same kernel,
same accumulation order; tests check it) at about half the time: measured here, the 24
layers plus lm_head of Qwen2.5-0.5B take 25-29 ms instead of 49-55 ms at one row and
31-38 ms instead of 66-73 ms at 8 rows (docs/batching.md, "Per-step overhead").

The packed tensor is an opaque oneDNN copy, so the plain matrices are freed once packed
(:func:`engine.quant.model.pack_model`); ``official`` reloads them on first use like the
quantized settings do. A tied embedding stays plain (it is a lookup table) beside the packed
head; the default model's head is untied. Only bf16 on a CPU whose oneDNN has bf16 kernels is packed:
float32 keeps MKL's sgemm (whose rounding transformers shares), CUDA keeps cuBLAS.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import functools
from dataclasses import dataclass
from typing import Any

import torch



def packing_available(dtype: torch.dtype, device: torch.device) -> bool:
    """Whether packing applies (engine.quant.model.pack_weights): bf16 on a CPU with oneDNN bf16
    kernels."""
    return (device.type == "cpu" and dtype == torch.bfloat16 and torch.backends.mkldnn.is_available()
            and bool(torch.ops.mkldnn._is_mkldnn_bf16_supported()))


@dataclass
class PackedLinear:
    """``y = x W^T + b`` with ``W`` in oneDNN's blocked layout (a copy made once)."""

    packed: torch.Tensor
    bias: torch.Tensor | None
    in_features: int
    out_features: int
    nbytes: int  # bytes of the weight (and bias) one call reads

    @classmethod
    def from_linear(cls, linear: Any) -> "PackedLinear":
        """``linear``: an :class:`engine.weights.Linear` (its ``weight`` and ``bias``)."""
        weight = linear.weight
        out_features, in_features = weight.shape
        bias = None if linear.bias is None else linear.bias.detach().contiguous()
        size = weight.numel() * weight.element_size() + (0 if bias is None else bias.numel() * bias.element_size())
        return cls(torch.ops.mkldnn._reorder_linear_weight(weight.detach().contiguous(), 1), bias,
                   in_features, out_features, size)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.mkldnn._linear_pointwise(x.contiguous(), self.packed, self.bias, "none", [], "")


def release_freed_memory() -> None:
    """Hand freed heap pages back to the OS (glibc ``malloc_trim``). The per-layer matrices are
    below glibc's mmap threshold, so freeing them after packing leaves the pages in the heap
    and the resident size unchanged until this is called. A no-op elsewhere."""
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


@functools.lru_cache(maxsize=1)
def _malloc_trim() -> Any:
    """glibc's ``malloc_trim``, looked up once, by its soname first (``find_library`` runs
    ``ldconfig``, a child process), or None."""
    for find in (lambda: "libc.so.6", lambda: ctypes.util.find_library("c")):
        try:
            return ctypes.CDLL(find()).malloc_trim
        except (OSError, AttributeError, TypeError):
            continue
    return None
