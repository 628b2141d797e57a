"""The low-bit forward's small operations in one C call each (``engine/quant/native/decode.c``).

Why: a one-token step of ``q8`` spent ~18 ms in the linears and ~4 ms between them, most of it
the fixed cost of a dozen torch calls per layer (an RMSNorm alone is 7). Here an RMSNorm, the
rotary embedding of q and k, silu(gate) * up, and a decode token's cache write + attention
are one call each. They round where transformers rounds in bf16, but sums and exponentials
may round in another order, so only forwards that promise no token equality with
``official`` use them: low-bit weights, bf16, on CPU (:func:`fused_for`). ``none`` keeps
torch's ops and its exact tokens.

The RMSNorm and the attention sum over a row; how close their rounding comes to torch's
depends on torch's own kernels, which differ by CPU (:func:`reductions_like_torch`).
"""
from __future__ import annotations

import functools
import logging
import math
from typing import Any

import torch

logger = logging.getLogger("miniserve.engine.fused")


def fused_for(weights: Any) -> bool:
    """Whether a forward over ``weights`` runs the fused operations: quantized (not exact)
    bf16 weights on CPU, with the native library loadable."""
    from engine.quant import exact_attention

    if weights.dtype != torch.bfloat16 or weights.device.type != "cpu" or exact_attention(weights):
        return False
    from engine.quant.native import NativeBuildError

    try:
        _library()
    except NativeBuildError as exc:  # no compiler, odd platform: torch's ops instead, said loudly
        from core.logs import log_event

        log_event(logger, "fused_ops_unavailable", level=logging.WARNING, reason=str(exc))
        return False
    return True


# torch CPU capabilities (torch.backends.cpu.get_cpu_capability()) on which the C RMSNorm and
# attention round closely enough to torch's kernels that q8 keeps its agreement with bf16
# (AVX-512: 0.995 free-running, results/quantization.json). With torch's AVX2 kernels they did
# not: 0.838 against 1.000 with torch's RMSNorm and attention (python -m bench.fused_ops
# --agreement, results/avx2/fused_agreement.json), so there only the per-element operations
# (rotary, silu * up) run in C.
REDUCTIONS_LIKE_TORCH = ("AVX512",)


def reductions_like_torch() -> bool:
    """Whether a fused forward also runs the C RMSNorm and decode attention on this CPU."""
    return torch.backends.cpu.get_cpu_capability() in REDUCTIONS_LIKE_TORCH


@functools.lru_cache(maxsize=1)
def _library() -> Any:
    """The loaded native library, looked up once (every fused call of a step goes through it)."""
    from engine.quant import native

    return native.library()


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm of the rows of a contiguous bf16 ``x [n, dim]`` (as engine.forward.rms_norm)."""
    x = x.contiguous()
    out = torch.empty_like(x)
    _library().ms_rms_norm_bf16(x.data_ptr(), weight.data_ptr(), out.data_ptr(), x.numel() // x.shape[-1],
                                x.shape[-1], eps)
    return out


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
