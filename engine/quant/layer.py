"""``QuantizedLinear``: one linear layer's q8 weights (int8 codes, an fp16 scale per 32 inputs),
run by our C kernel (:mod:`engine.quant.q8`) at every row count, in one call.

Why no full-precision fallback for many rows: the engine frees the bf16 copies (keeping them
would double the memory), and one kernel call over all rows measured faster than slices.
A tensor whose codes all fit in 5 bits (the default model's Q5_0 tensors, quantized from the
GGUF) is stored packed (``q5``): fewer bytes per decode step, the same values.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

import torch

from engine.quant import q8
from engine.quant.mapped import map_tensors

# Quantize big matrices (lm_head) in row chunks to bound the float32 peak.
_CHUNK_ROWS = 8192


@dataclass(eq=False)
class QuantizedLinear:
    """y = x @ W.T + b with W in q8 (``mode`` "q8") or q8 packed in 5 bits ("q5")."""

    mode: str
    in_features: int
    out_features: int
    qweight: torch.Tensor  # q8: uint8 [N, K padded to 32] (q8.interleave); q5: q8.pack5
    params: torch.Tensor   # fp16 scales [N, K/32]
    group_size: int
    bias: torch.Tensor | None
    kernel_bias: torch.Tensor | None = None  # the bias in float32, as the kernel adds it

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() == 2 and x.shape[0] and x.shape[1] == self.in_features:  # no reshapes
            return q8.linear(x, self.qweight, self.params, self.kernel_bias, packed5=self.mode == "q5")
        x2d = x.reshape(-1, self.in_features)
        if x2d.shape[0] == 0:
            return x.new_zeros(*x.shape[:-1], self.out_features)
        y = q8.linear(x2d, self.qweight, self.params, self.kernel_bias, packed5=self.mode == "q5")
        return y.reshape(*x.shape[:-1], self.out_features)

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """The weight these low-bit values stand for, [N, K] (for checks)."""
        codes = q8.unpack5(self.qweight, self.params.shape[1] * q8.GROUP) if self.mode == "q5" else self.qweight
        return q8.dequantize(codes, self.params, self.in_features).to(dtype)

    @property
    def nbytes(self) -> int:
        """Bytes this layer holds."""
        tensors = [self.qweight, self.params] + ([self.bias] if self.bias is not None else [])
        if self.kernel_bias is not None and self.kernel_bias is not self.bias:
            tensors.append(self.kernel_bias)
        return sum(t.numel() * t.element_size() for t in tensors)


def quantize_linear(weight: torch.Tensor, bias: torch.Tensor | None) -> QuantizedLinear:
    """Quantize one [N, K] weight to q8 (packed in 5 bits where every code fits and 5 bits are
    faster here: :func:`engine.quant.q8.packs_five_bits`)."""
    n, k = weight.shape
    parts = [q8.quantize(weight[i:i + _CHUNK_ROWS]) for i in range(0, n, _CHUNK_ROWS)]
    mode = "q8"
    packed = [q8.pack5(codes) for codes, _ in parts] if q8.packs_five_bits() else [None]
    if all(p is not None for p in packed):
        mode, parts = "q5", [(p, s) for p, (_, s) in zip(packed, parts)]
    bias_f32 = None if bias is None else bias.detach().float().contiguous()
    return QuantizedLinear(mode=mode, in_features=k, out_features=n, qweight=torch.cat([p[0] for p in parts]),
                           params=torch.cat([p[1] for p in parts]), group_size=q8.GROUP,
                           bias=None if bias is None else bias.detach(), kernel_bias=bias_f32)


@dataclass(eq=False)
class QuantizedEmbedding:
    """The embedding table in q8 (int8 codes, a scale per group of 32 inputs): about half the
    memory of bf16. A step reads only its tokens' rows, so speed does not change; ``lookup``
    dequantizes just those rows to the model dtype. q8's rounding keeps the default model's
    GGUF table (Q5_0) exactly, and a table whose codes all fit 5 bits is stored packed
    (:func:`engine.quant.q8.pack5`)."""

    qweight: torch.Tensor  # int8 [vocab, hidden]; packed5: q8.pack5 rows (uint8)
    scales: torch.Tensor  # float32 [vocab, hidden / group]; packed5: fp16 [vocab, hidden / 32]
    dtype: torch.dtype
    hidden: int = 0
    packed5: bool = False

    @classmethod
    def from_table(cls, table: torch.Tensor, dtype: torch.dtype | None = None) -> "QuantizedEmbedding":
        """``table [vocab, hidden]`` (hidden a multiple of 32); ``dtype``: what lookups return
        (default: the table's)."""
        if table.shape[1] % q8.GROUP:
            raise ValueError(f"an embedding of width {table.shape[1]} does not split into groups of {q8.GROUP}")
        return cls._grouped(table, dtype or table.dtype)

    @classmethod
    def _grouped(cls, table: torch.Tensor, dtype: torch.dtype) -> "QuantizedEmbedding":
        hidden = table.shape[1]
        parts = [q8.quantize(table[i:i + _CHUNK_ROWS]) for i in range(0, table.shape[0], _CHUNK_ROWS)]
        packed = [q8.pack5(codes) for codes, _ in parts]
        scales = torch.cat([s for _, s in parts])
        if all(p is not None for p in packed):
            return cls(torch.cat(packed), scales, dtype, hidden, packed5=True)
        codes = torch.cat([(q8.deinterleave(c).to(torch.int16) - q8.OFFSET).to(torch.int8) for c, _ in parts])
        return cls(codes, scales.float(), dtype, hidden)

    @property
    def device(self) -> torch.device:
        return self.qweight.device

    @property
    def shape(self) -> torch.Size:
        return torch.Size((self.qweight.shape[0], self.hidden or self.qweight.shape[1]))

    def mapped(self, directory: Path) -> "QuantizedEmbedding":
        """This table read from a file under ``directory`` through a shared-page mapping
        (:mod:`engine.quant.mapped`): only the rows a worker looks up become resident.
        Itself unchanged when the file cannot be written."""
        views = map_tensors([self.qweight, self.scales], directory)
        if views is None:
            return self
        return dataclasses.replace(self, qweight=views[0], scales=views[1])

    def lookup(self, input_ids: torch.Tensor) -> torch.Tensor:
        if self.packed5:
            return q8.rows5(self.qweight, self.scales, input_ids, self.hidden, self.dtype)
        codes, scales = self.qweight[input_ids].float(), self.scales[input_ids].float()
        groups = scales.shape[-1]
        rows = codes.reshape(*codes.shape[:-1], groups, -1) * scales[..., None]
        return rows.reshape(codes.shape).to(self.dtype)

    @property
    def nbytes(self) -> int:
        return self.qweight.numel() + self.scales.numel() * self.scales.element_size()

    def element_size(self) -> int:
        return 1
