"""The bandwidth floor of a GGUF file's decode: the fastest batch-1 decode the machine's memory allows.

At batch 1 each token reads every weight once, so tokens/s cannot beat ``read bandwidth /
bytes a token reads``. The bytes come from the file's own tensors, in their stored types:
every tensor, except that of the embedding table only the token's row is read -- unless the
table is also the output matrix (tied embeddings, ``output.weight`` absent), which reads it
whole. The KV cache a short context adds is left out, so the floor is slightly optimistic.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

EMBEDDING = "token_embd.weight"
OUTPUT = "output.weight"


@dataclass(frozen=True)
class TensorBytes:
    name: str
    n_bytes: int
    rows: int  # the product of every dimension but the innermost (GGUF's ne[0])


@dataclass(frozen=True)
class TokenBytes:
    tensors: int          # all tensor bytes in the file
    embedding: int        # the embedding table's bytes
    embedding_row: int    # one row of it
    tied: bool            # the embedding table is the output matrix too
    per_token: int        # bytes one batch-1 decode step reads


def token_bytes(tensors: list[TensorBytes]) -> TokenBytes:
    by = {t.name: t for t in tensors}
    if EMBEDDING not in by:
        raise ValueError(f"no {EMBEDDING} among the file's tensors")
    table = by[EMBEDDING]
    row = table.n_bytes // max(table.rows, 1)
    total = sum(t.n_bytes for t in tensors)
    tied = OUTPUT not in by
    per_token = total + row if tied else total - table.n_bytes + row
    return TokenBytes(total, table.n_bytes, row, tied, per_token)


def read_tensors(gguf: Path) -> list[TensorBytes]:
    """Each tensor's stored size, from the file's header (gguf-py; nothing is dequantized)."""
    from gguf import GGUFReader

    reader = GGUFReader(str(gguf))
    out = []
    for tensor in reader.tensors:
        dims = [int(d) for d in tensor.shape]
        rows = 1
        for d in dims[1:]:
            rows *= d
        out.append(TensorBytes(tensor.name, int(tensor.n_bytes), rows))
    return out


def floor_tps(bandwidth_gbs: float, per_token: int) -> float:
    """Tokens/s at the floor: bytes/s over bytes per token (0 when either is unknown)."""
    return bandwidth_gbs * 1e9 / per_token if bandwidth_gbs > 0 and per_token > 0 else 0.0


def pct_of_floor(tps: float | None, floor: float) -> float | None:
    return round(100 * tps / floor, 1) if tps and floor else None
