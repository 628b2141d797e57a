"""Linear layers and the embedding over GGUF tensors as the file stores them.

:class:`BlockLinear` is what the hand-written forward calls in place of a ``QuantizedLinear``
when a quantized GGUF runs on its own bits (``MINISERVE_QUANT=gguf``): ``x [..., in] -> y
[..., out]``. Its weight is one or more *parts* stacked by rows, each a
:class:`~engine.quant.gguf_blocks.BlockWeight` (run by :func:`block_matmul`) or a small
full-precision matrix (a GGUF may keep a tensor whose rows are not whole blocks in F32/F16).
Why parts rather than one stacked matrix: the forward fuses q/k/v and gate/up, and the
tensors of one layer may have different types (Q4_K_M keeps some ``attn_v`` in Q6_K or Q8_0
beside Q4_K/Q5_0 ``attn_q``); stacking would also copy the mapped bytes. Each part's output
lands in its slice of one float32 result, so the fused call is one result for the forward.

:class:`BlockEmbedding` dequantizes only the rows asked for (a step reads one row per token).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.quant import gguf_native
from engine.quant.gguf_blocks import BlockWeight, block_matmul, dequantize_rows

Part = BlockWeight | torch.Tensor   # a block-format matrix, or a full-precision [out, in] one


def part_shape(part: Part) -> tuple[int, int]:
    """(out_features, in_features) of one part."""
    if isinstance(part, BlockWeight):
        return part.out_features, part.in_features
    return int(part.shape[0]), int(part.shape[1])


def part_nbytes(part: Part) -> int:
    return part.nbytes if isinstance(part, BlockWeight) else part.numel() * part.element_size()


def part_matmul(x2d: torch.Tensor, part: Part) -> torch.Tensor:
    """``x2d @ W.T`` in float32 for one part."""
    if isinstance(part, BlockWeight):
        return block_matmul(x2d, part)
    return x2d.to(torch.float32) @ part.to(torch.float32).T


def dequantize_part(part: Part) -> torch.Tensor:
    """The part as a float32 ``[out, in]`` matrix (for ``official``'s on-demand weights and checks)."""
    if isinstance(part, BlockWeight):
        return dequantize_rows(part)
    return part.to(torch.float32)


@dataclass(eq=False)
class BlockLinear:
    """``y = x @ W.T + b`` with ``W`` the row-wise stack of ``parts``; ``y`` in ``x``'s dtype."""

    parts: tuple[Part, ...]
    bias: torch.Tensor | None = None  # float32 [out_features], added before the cast

    def __post_init__(self) -> None:
        widths = {part_shape(p)[1] for p in self.parts}
        if len(widths) != 1:
            raise ValueError(f"parts of one BlockLinear take different input widths: {sorted(widths)}")
        if self.bias is not None and self.bias.shape != (self.out_features,):
            raise ValueError(f"bias is {tuple(self.bias.shape)}, expected ({self.out_features},)")

    @property
    def in_features(self) -> int:
        return part_shape(self.parts[0])[1]

    @property
    def out_features(self) -> int:
        return sum(part_shape(p)[0] for p in self.parts)

    @property
    def nbytes(self) -> int:
        """Bytes a call reads: the parts' own bytes (the file's bits) and the bias."""
        bias = 0 if self.bias is None else self.bias.numel() * self.bias.element_size()
        return sum(part_nbytes(p) for p in self.parts) + bias

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        x2d = x.reshape(-1, self.in_features)
        if len(self.parts) == 1:
            y = part_matmul(x2d, self.parts[0]) if x2d.shape[0] else x2d.new_zeros(0, self.out_features,
                                                                                    dtype=torch.float32)
        else:
            y = torch.empty(x2d.shape[0], self.out_features, dtype=torch.float32, device=x2d.device)
            start = 0
            for part in self.parts:
                rows = part_shape(part)[0]
                if x2d.shape[0]:
                    y[:, start:start + rows] = part_matmul(x2d, part)
                start += rows
        if self.bias is not None:
            y += self.bias
        return y.to(x.dtype).reshape(*x.shape[:-1], self.out_features)

    def dequantize(self) -> torch.Tensor:
        """The full-precision ``[out, in]`` float32 weight these parts stand for (for checks)."""
        return torch.cat([dequantize_part(p) for p in self.parts])


@dataclass(eq=False)
class BlockEmbedding:
    """The embedding table kept as the file stores it; ``lookup`` dequantizes just the rows asked for."""

    table: Part       # [vocab, hidden]: a BlockWeight, or a full-precision tensor (F32/F16 table)
    dtype: torch.dtype  # what lookups return (the model dtype)

    @property
    def device(self) -> torch.device:
        return self.table.data.device if isinstance(self.table, BlockWeight) else self.table.device

    @property
    def shape(self) -> torch.Size:
        return torch.Size(part_shape(self.table))

    @property
    def nbytes(self) -> int:
        return part_nbytes(self.table)

    def element_size(self) -> int:
        """Bytes per value, rounded up (what ``bytes_per_token`` counts for one row)."""
        vocab, hidden = part_shape(self.table)
        return max(1, -(-self.nbytes // (vocab * hidden)))

    def lookup(self, input_ids: torch.Tensor) -> torch.Tensor:
        ids = input_ids.reshape(-1)
        if not isinstance(self.table, BlockWeight):
            rows = self.table[ids].to(self.dtype)
        else:
            rows = self.rows(ids).to(self.dtype)
        return rows.reshape(*input_ids.shape, rows.shape[-1])

    def rows(self, ids: torch.Tensor) -> torch.Tensor:
        """float32 rows ``ids`` of a block-format table: only those rows are read, by the C
        dequantization (gguf-py's numpy one costs more than the rest of a small model's step)."""
        table = self.table
        assert isinstance(table, BlockWeight)
        return gguf_native.dequantize(table.ggml_type, table.data, table.in_features, ids=ids.cpu(),
                                      interleaved=table.interleaved)
