"""The fused small operations' C calls, one each (``engine/quant/native/decode.c``).

Why: a one-token step of ``q8`` spent ~18 ms in the linears and ~4 ms between them, most of it
the fixed cost of a dozen torch calls per layer (an RMSNorm alone is 7). Here an RMSNorm, the
rotary embedding of q and k, silu(gate) * up, a decode token's cache write + attention, and a
paged step's write + gather are one call each. They round where transformers rounds in bf16,
but sums and exponentials may round in another order, so only forwards that promise no token
equality with ``official`` use them (:mod:`engine.ops.fused_ops`, chosen by
:func:`engine.ops.choose.small_ops_for`): low-bit weights, bf16, on CPU. ``none`` keeps
torch's ops and its exact tokens.

How closely the sums over a row (RMSNorm, attention) round like torch's depends on torch's own
kernels, which differ by CPU: the RMSNorm sums in torch's order where its vectors hold 8 floats
(:func:`torch_sum_lanes`); where the attention runs in C is the chooser's call.
"""
from __future__ import annotations

import functools
import math
from typing import Any

import torch

from engine.quant import native


def unavailable() -> str | None:
    """Why the native library cannot be loaded here (no compiler, odd platform), or None."""
    try:
        _library()
    except native.NativeBuildError as exc:
        return str(exc)
    return None


@functools.lru_cache(maxsize=1)
def _library() -> Any:
    """The loaded native library, looked up once (every fused call of a step goes through it)."""
    return native.library()


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm of the rows of a contiguous bf16 ``x [n, dim]`` (as engine.ops.torch_ops.rms_norm;
    bit for bit where torch's vectors hold 8 floats, :func:`torch_sum_lanes`)."""
    x = x.contiguous()
    out = torch.empty_like(x)
    _library().ms_rms_norm_bf16(x.data_ptr(), weight.data_ptr(), out.data_ptr(), x.numel() // x.shape[-1],
                                x.shape[-1], eps, torch_sum_lanes())
    return out


@functools.lru_cache(maxsize=1)
def torch_sum_lanes() -> int:
    """Lanes of torch's float vectors whose summation order the C RMSNorm reproduces: 8 (its
    AVX2 and default kernels: checked bit for bit here); 0 on AVX-512, where the C sum keeps its
    own order (16 partial sums), which kept q8's agreement with bf16 there (0.995)."""
    return 0 if torch.backends.cpu.get_cpu_capability() == "AVX512" else 8


def rotary_(rows: torch.Tensor, heads: int, head_dim: int, cos: torch.Tensor, sin: torch.Tensor) -> None:
    """Rotate the first ``heads`` heads of each row of ``rows [n, >= heads * head_dim]`` (a
    row-strided view, e.g. q and k at the front of the fused qkv output) in place; ``cos``,
    ``sin``: contiguous ``[n, 1, head_dim]`` (engine.forward.RotaryTable.lookup)."""
    if rows.stride(-1) != 1:
        raise ValueError("rotary_ needs rows with unit stride along the hidden axis")
    status = _library().ms_rotary_bf16(rows.data_ptr(), rows.shape[0], rows.stride(0), heads, head_dim,
                                       cos.contiguous().data_ptr(), sin.contiguous().data_ptr())
    if status != 0:
        raise ValueError(f"rotary_ cannot rotate heads of {head_dim}")


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up of a contiguous bf16 ``[n, 2 * inter]`` holding [gate | up] per row."""
    gate_up = gate_up.contiguous()
    inter = gate_up.shape[-1] // 2
    out = gate_up.new_empty(*gate_up.shape[:-1], inter)
    _library().ms_silu_mul_bf16(gate_up.data_ptr(), out.data_ptr(), gate_up.numel() // gate_up.shape[-1], inter)
    return out


def attend_decode(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
                  position: int) -> torch.Tensor:
    """One token: write its ``k, v [1, kv_heads, d]`` at ``position`` of one layer's contiguous
    ``keys/values [kv_heads, capacity, d]`` and attend its ``q [1, heads, d]`` over positions
    ``0..position``. Returns ``[1, heads * d]``."""
    heads, dim = q.shape[1], q.shape[2]
    kv_heads, capacity = keys.shape[0], keys.shape[1]
    if not (keys.is_contiguous() and values.is_contiguous()):
        raise ValueError("attend_decode needs contiguous cache buffers")
    q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    out = q.new_empty(1, heads * dim)
    status = _library().ms_attend_decode_bf16(q.data_ptr(), k.data_ptr(), v.data_ptr(), keys.data_ptr(),
                                              values.data_ptr(), capacity, position, heads, kv_heads, dim,
                                              1.0 / math.sqrt(dim), out.data_ptr(), torch.get_num_threads())
    if status != 0:
        raise MemoryError("attend_decode could not allocate its score buffer")
    return out


def attend_rows(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
                start: int) -> torch.Tensor:
    """A few consecutive tokens of one sequence (a verify step, a short chunk): write their ``k,
    v [n, kv_heads, d]`` at positions ``start..`` of one layer's contiguous ``keys/values
    [kv_heads, capacity, d]`` and attend each ``q [n, heads, d]`` causally, as
    :func:`paged_attend` attends such a step. Returns ``[n, heads * d]``."""
    n, heads, dim = q.shape
    kv_heads, capacity = keys.shape[0], keys.shape[1]
    if not (keys.is_contiguous() and values.is_contiguous()):
        raise ValueError("attend_rows needs contiguous cache buffers")
    q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    out = q.new_empty(n, heads * dim)
    status = _library().ms_attend_rows_bf16(q.data_ptr(), k.data_ptr(), v.data_ptr(), keys.data_ptr(),
                                            values.data_ptr(), capacity, start, n, heads, kv_heads, dim,
                                            1.0 / math.sqrt(dim), out.data_ptr(), torch.get_num_threads())
    if status != 0:
        raise MemoryError("attend_rows could not allocate its score buffers")
    return out


def paged_attend(pool: Any, layer: int, block_tables: torch.Tensor, rows: torch.Tensor, positions: torch.Tensor,
                 q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, write: bool) -> torch.Tensor:
    """A paged step's attention in C, reading the blocks where they lie (no gather): packed
    token ``t`` (``q [n, heads, d]``) of the sequence with block table ``block_tables[rows[t]]``
    at ``positions[t]`` attends over that sequence's positions ``0..positions[t]``. ``write``:
    first store each token's ``k, v [n, kv_heads, d]`` in its slot (only for decode-only steps,
    one token per sequence; otherwise the caller has stored them). Returns ``[n, heads, d]``."""
    tokens, heads, dim = q.shape
    geometry = pool.geometry
    q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    tables, rows, positions = block_tables.contiguous(), rows.contiguous(), positions.contiguous()
    out = torch.empty_like(q)
    status = _library().ms_paged_attend_bf16(
        q.data_ptr(), k.data_ptr(), v.data_ptr(), pool.k.data_ptr(), pool.v.data_ptr(), geometry.num_layers, layer,
        pool.block_size, tables.data_ptr(), tables.shape[1], rows.data_ptr(), positions.data_ptr(), tokens, heads,
        geometry.num_kv_heads, dim, 1.0 / math.sqrt(dim), out.data_ptr(), torch.get_num_threads(), int(write))
    if status != 0:
        raise RuntimeError(f"paged attention failed with status {status}")
    return out


def paged_gather(pool: Any, layer: int, block_tables: torch.Tensor, slots: torch.Tensor, k: torch.Tensor,
                 v: torch.Tensor, length: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Store a paged step's new ``k, v [n, kv_heads, d]`` at ``slots`` of one layer, then return
    positions ``0..length-1`` of each block table's keys and values as ``[batch, kv_heads,
    length, d]``, for torch's attention: the values torch's indexing, gather and transpose
    produce, in one C call (those ops cost ~60 us per layer of a decode step)."""
    geometry = pool.geometry
    k, v = k.contiguous(), v.contiguous()
    tables, slots = block_tables.contiguous(), slots.contiguous()
    batch = tables.shape[0]
    keys = k.new_empty(batch, geometry.num_kv_heads, length, geometry.head_dim)
    values = torch.empty_like(keys)
    status = _library().ms_paged_gather_bf16(
        k.data_ptr(), v.data_ptr(), slots.data_ptr(), slots.shape[0], pool.k.data_ptr(), pool.v.data_ptr(),
        geometry.num_layers, layer, pool.block_size, geometry.num_kv_heads, geometry.head_dim, tables.data_ptr(),
        batch, tables.shape[1], length, keys.data_ptr(), values.data_ptr())
    if status != 0:
        raise ValueError(f"paged gather of {length} positions from {tables.shape[1]} blocks of {pool.block_size}")
    return keys, values
