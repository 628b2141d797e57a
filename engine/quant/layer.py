"""``QuantizedLinear``: one linear layer's low-bit weights and the rule for running them.

Why a per-call choice: decoding one sequence multiplies 1 row by each weight matrix and is
bound by reading the weights, so fewer bytes per weight wins (int8 ~2.8x, int4 ~4.5x over
bf16 here). With many rows (prefill, big batches) the packed CPU kernels lose to the bf16
GEMM, whose cost is compute, not bytes. So a layer runs the packed kernel up to ``max_rows``
rows and the full-precision GEMM above, with the model's own weight (``reference``, shared
with the transformers module, never copied) when one is kept. The engine's quantized
settings keep none (the bf16 copies would double the memory): there every row count runs
the packed kernel, in one call (one call over all rows measured faster than slices).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from engine.quant import kernels, q8
from engine.quant.kernels import KERNEL_DTYPE
from engine.quant.mapped import map_tensors
from engine.quant.rounding import refine_int4

QUANT_MODES = ("none", "int8", "int4", "int4-hqq", "int4-awq", "q8")
DEFAULT_GROUP_SIZE = 32  # best greedy agreement on the default model (docs/quantization.md)
# Rows up to which the packed kernel beats bf16 (measured by ``python -m bench.quantization
# --kernels`` on the default model's shapes, 2 threads; crossover lies between 8 and 16).
DEFAULT_MAX_ROWS = 8
# int4 step candidates per group, (max - min) / L (see kernels.quantize_int4).
DEFAULT_INT4_LEVELS = (15, 14, 13, 12)
# Quantize big matrices (lm_head) in row chunks to bound the float32 peak; a multiple of 64
# because the CPU int4 packing interleaves rows in blocks of 64 (tests/quant checks it).
_CHUNK_ROWS = 8192


@dataclass(eq=False)
class QuantizedLinear:
    """y = x @ W.T + b with W stored as int8 (per row) or int4 (per group), plus the rule
    above. ``mode`` is the storage actually used (an int4 request falls back to int8 for a
    layer whose input size no int4 group divides)."""

    mode: str
    in_features: int
    out_features: int
    qweight: torch.Tensor  # int8 [N, K padded to 16]; int4 packed uint8 [N_pad, K/2]; q8 uint8 [N, K padded to 32]; q5 packed (q8.pack5)
    params: torch.Tensor  # int8: scales [N] bf16; int4: scales_and_zeros [K/g, N_pad, 2] bf16; q8: fp16 [N, K/32]
    group_size: int | None
    bias: torch.Tensor | None
    reference: torch.Tensor | None = None
    max_rows: int = DEFAULT_MAX_ROWS
    kernel_bias: torch.Tensor | None = None  # q8: the bias in float32, as the kernel adds it

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() == 2 and x.shape[0] and x.shape[1] == self.in_features and self.mode in q8.MODES:  # no reshapes
            return q8.linear(x, self.qweight, self.params, self.kernel_bias, packed5=self.mode == "q5")
        x2d = x.reshape(-1, self.in_features)
        rows = x2d.shape[0]
        if rows == 0:
            return x.new_zeros(*x.shape[:-1], self.out_features)
        if self.mode in q8.MODES:   # our kernel: every row count, bias added inside, output in x's dtype
            y = q8.linear(x2d, self.qweight, self.params, self.kernel_bias, packed5=self.mode == "q5")
            return y.reshape(*x.shape[:-1], self.out_features)
        if rows > self.max_rows and self.reference is not None:
            bias = None if self.bias is None else self.bias.to(x.dtype)
            y = F.linear(x2d, self.reference.to(x.dtype), bias)
        else:
            y = self._packed(x2d).to(x.dtype)
            if self.bias is not None:
                y = y + self.bias.to(x.dtype)
        return y.reshape(*x.shape[:-1], self.out_features)

    def _packed(self, x2d: torch.Tensor) -> torch.Tensor:
        if self.mode in q8.MODES:
            return q8.linear(x2d, self.qweight, self.params, None, packed5=self.mode == "q5")
        xk = x2d.to(KERNEL_DTYPE)
        if self.mode == "int8":
            if self.qweight.shape[1] != self.in_features:  # K zero-padded to a multiple of 16
                xk = F.pad(xk, (0, self.qweight.shape[1] - self.in_features))
            return kernels.int8_mm(xk.contiguous(), self.qweight, self.params)
        y = kernels.int4_mm(xk.contiguous(), self.qweight, self.group_size, self.params)
        return y if y.shape[-1] == self.out_features else y[:, : self.out_features]

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """The weight these low-bit values stand for, [N, K] (for checks and big batches)."""
        if self.mode == "int8":
            return kernels.dequantize_int8(self.qweight, self.params)[:, : self.in_features].to(dtype)
        if self.mode in q8.MODES:
            codes = q8.unpack5(self.qweight, self.params.shape[1] * q8.GROUP) if self.mode == "q5" else self.qweight
            return q8.dequantize(codes, self.params, self.in_features).to(dtype)
        q = _unpack_int4(self.qweight, self.params, self.group_size, self.in_features)
        return kernels.dequantize_int4(q, self.params, self.group_size)[: self.out_features].to(dtype)

    @property
    def nbytes(self) -> int:
        """Bytes this layer adds (the shared reference weight is not counted)."""
        tensors = [self.qweight, self.params] + ([self.bias] if self.bias is not None else [])
        if self.kernel_bias is not None and self.kernel_bias is not self.bias:
            tensors.append(self.kernel_bias)
        return sum(t.numel() * t.element_size() for t in tensors)


def storage_mode(mode: str) -> str:
    """The kernel a rounding mode runs on (``int4-hqq`` is int4 storage, ``q5`` is q8 packed)."""
    if mode == "q5":
        return "q8"
    return "int4" if mode.startswith("int4") else mode


def _unpack_int4(packed: torch.Tensor, params: torch.Tensor, group: int, k: int) -> torch.Tensor:
    """Recover q[N_pad, K] by running the kernel on an identity with scale 1 and zero 8, so
    it returns (q - 8) * 1 + 8 = q exactly: layout-agnostic, but O(K^2 N), for checks only."""
    unit = torch.stack([torch.ones_like(params[..., 0]), torch.full_like(params[..., 0], 8.0)], -1)
    q_t = kernels.int4_mm(torch.eye(k, dtype=KERNEL_DTYPE), packed, group, unit.contiguous())
    return q_t.float().T.round().to(torch.int32)


def quantize_linear(weight: torch.Tensor, bias: torch.Tensor | None, mode: str,
                    group_size: int = DEFAULT_GROUP_SIZE, keep_reference: bool = True,
                    max_rows: int = DEFAULT_MAX_ROWS,
                    int4_levels: tuple[int, ...] = DEFAULT_INT4_LEVELS,
                    importance: torch.Tensor | None = None) -> QuantizedLinear:
    """Quantize one [N, K] weight in ``mode`` (int8, int4, or int4 storage with refined
    rounding: int4-hqq, or int4-awq weighted by ``importance``, the mean squared input per
    column from :mod:`engine.quant.calibration`). ``keep_reference`` keeps a *reference* to ``weight`` (no copy) for
    the many-rows path; without it every row count runs the packed kernel."""
    if mode not in QUANT_MODES[1:]:
        raise ValueError(f"unknown quantization mode {mode!r}; expected one of {QUANT_MODES}")
    n, k = weight.shape
    rounding = mode
    mode = storage_mode(mode)
    group = kernels.int4_group_size(k, group_size) if mode == "int4" else None
    if mode == "int4" and group is None:
        mode = rounding = "int8"  # no accepted int4 group divides K: keep this layer at int8
    if mode == "q8":
        parts = [q8.quantize(weight[i:i + _CHUNK_ROWS]) for i in range(0, n, _CHUNK_ROWS)]
        # a Q5_0 tensor fits in 5 bits exactly (where 5 bits are faster: q8.FIVE_BIT_PATHS)
        packed = [q8.pack5(codes) for codes, _ in parts] if q8.packs_five_bits() else [None]
        if all(p is not None for p in packed):
            mode, parts = "q5", [(p, s) for p, (_, s) in zip(packed, parts)]
        bias_f32 = None if bias is None else bias.detach().float().contiguous()
        return QuantizedLinear(mode=mode, in_features=k, out_features=n, qweight=torch.cat([p[0] for p in parts]),
                               params=torch.cat([p[1] for p in parts]), group_size=q8.GROUP,
                               bias=None if bias is None else bias.detach(),
                               reference=weight.detach() if keep_reference else None, max_rows=max_rows,
                               kernel_bias=bias_f32)
    if mode == "int8":
        k_pad = (-k) % kernels.INT8_K_MULTIPLE
        source = F.pad(weight.detach(), (0, k_pad)) if k_pad else weight
        parts = [kernels.quantize_int8(source[i:i + _CHUNK_ROWS]) for i in range(0, n, _CHUNK_ROWS)]
        qweight = torch.cat([p[0] for p in parts])
        params = torch.cat([p[1] for p in parts])
    else:
        refine = rounding in ("int4-hqq", "int4-awq")
        qweight, params = _quantize_int4_padded(weight, group, int4_levels, refine,
                                                importance if rounding == "int4-awq" else None)
    kept_bias = None if bias is None else bias.detach()
    return QuantizedLinear(mode=mode, in_features=k, out_features=n, qweight=qweight, params=params,
                           group_size=group, bias=kept_bias,
                           reference=weight.detach() if keep_reference else None, max_rows=max_rows)


def _quantize_int4_padded(weight: torch.Tensor, group: int, levels: tuple[int, ...], refine: bool = False,
                          importance: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """int4-pack in row chunks (multiples of 64 rows pack independently), padding N to 16."""
    n, k = weight.shape
    pad = (-n) % kernels.INT4_N_MULTIPLE
    if pad:
        weight = torch.cat([weight.detach(), weight.new_zeros(pad, k)])
    packed, params = [], []
    for start in range(0, weight.shape[0], _CHUNK_ROWS):
        chunk = weight[start:start + _CHUNK_ROWS]
        q, sz = (refine_int4(chunk, group, levels, importance) if refine
                 else kernels.quantize_int4(chunk, group, levels))
        packed.append(kernels.pack_int4(q))
        params.append(sz)
    return torch.cat(packed), torch.cat(params, dim=1).contiguous()


@dataclass(eq=False)
class QuantizedEmbedding:
    """The embedding table as int8 (symmetric) with a float32 scale per row, or per group of
    ``group`` inputs: about half the memory of bf16. A step reads only its tokens' rows, so
    speed does not change; ``lookup`` dequantizes just those rows to the model dtype. Groups
    of 32 use q8's rounding, which keeps the default model's GGUF table (Q5_0) exactly, and
    a table whose codes all fit 5 bits is stored packed (:func:`engine.quant.q8.pack5`)."""

    qweight: torch.Tensor  # int8 [vocab, hidden]; packed5: q8.pack5 rows (uint8)
    scales: torch.Tensor  # float32 [vocab, hidden / group]; packed5: fp16 [vocab, hidden / 32]
    dtype: torch.dtype
    hidden: int = 0
    packed5: bool = False

    @classmethod
    def from_table(cls, table: torch.Tensor, group: int | None = None,
                   dtype: torch.dtype | None = None) -> "QuantizedEmbedding":
        """``dtype``: what lookups return (default: the table's)."""
        vocab, hidden = table.shape
        group = group if group and hidden % group == 0 else hidden
        if group == q8.GROUP:
            return cls._grouped(table, dtype or table.dtype)
        codes, scales = [], []
        for i in range(0, vocab, _CHUNK_ROWS):
            q, s = kernels.quantize_int8(table[i:i + _CHUNK_ROWS].reshape(-1, group))
            codes.append(q.reshape(-1, hidden))
            scales.append(s.float().reshape(-1, hidden // group))
        return cls(torch.cat(codes), torch.cat(scales), dtype or table.dtype, hidden)

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
