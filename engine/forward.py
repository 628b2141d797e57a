"""The hand-written forward of the Qwen2/Llama family: embedding -> N x (RMSNorm, attention,
RMSNorm, SwiGLU) -> norm -> lm_head, driven by the model's description
(:class:`engine.architecture.ModelSpec`: q/k RMSNorm, rotary frequencies, sliding window).

Tokens travel flattened, ``hidden [N, hidden_size]`` with no batch dimension, so one call can
carry a prefill, one decode token, or (for a batching scheduler) tokens of several sequences.
Everything that depends on *where the keys and values live* is behind the
:class:`AttentionCache` seam:

- ``positions = cache.begin(n)``: the rotary positions of the ``n`` new tokens, as an ``int``
  (first position of a contiguous run) or a ``LongTensor [n]`` (any positions);
- ``out = cache.attend(layer, q, k, v, window=None)``: store the new ``k, v [n, kv_heads, head_dim]``
  (already rotated) for ``layer`` and return attention of ``q [n, heads, head_dim]`` over
  everything the sequence holds (only the last ``window`` positions where a sliding window
  is given), as ``[n, heads * head_dim]``;
- ``cache.commit(n)``: after the last layer, the new tokens become part of the sequence.

The contiguous cache (:mod:`engine.kv_cache`), the no-cache path and the paged cache all
implement it. Numerics follow transformers' Qwen2 so greedy outputs match token for token:
RMSNorm in float32, rotary tables computed in float32 and cast to the model dtype.
"""
from __future__ import annotations

import logging
from typing import Any, Protocol

import torch
import torch.nn.functional as F

from core.logs import log_event
from engine import fused as fused_ops
from engine.quant.model import exact_attention
from engine.quant.step import DecodeStep
from engine.weights import ForwardConfig, Qwen2Weights

logger = logging.getLogger("miniserve.engine.forward")
Positions = int | torch.Tensor
_UNBUILT = object()


def fused_for(weights: Any) -> bool:
    """Whether a forward over ``weights`` runs the fused operations (engine.fused): quantized
    (not exact) bf16 weights on CPU, with the native library loadable (said loudly when not)."""
    if weights.dtype != torch.bfloat16 or weights.device.type != "cpu" or exact_attention(weights):
        return False
    reason = fused_ops.unavailable()
    if reason is not None:  # no compiler, odd platform: torch's ops instead
        log_event(logger, "fused_ops_unavailable", level=logging.WARNING, reason=reason)
        return False
    return True


class AttentionCache(Protocol):
    def begin(self, num_new: int) -> Positions: ...

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
               window: int | None = None) -> torch.Tensor: ...

    def commit(self, num_new: int) -> None: ...


class RotaryTable:
    """cos/sin for positions ``0..capacity-1`` (grown on demand), laid out as transformers does,
    from the description's inverse frequencies (scaled as its rope type says)."""

    def __init__(self, config: ForwardConfig, dtype: torch.dtype, device: torch.device, capacity: int = 4096) -> None:
        self._inv_freq = torch.tensor(config.spec.inv_freq, dtype=torch.float, device=device)
        self._scaling = config.spec.rope_scaling
        self.dtype, self.device = dtype, device
        self.cos = self.sin = torch.empty(0)
        self._build(capacity)

    def _build(self, capacity: int) -> None:
        positions = torch.arange(capacity, device=self.device, dtype=torch.float)
        freqs = positions[:, None] * self._inv_freq
        emb = torch.cat((freqs, freqs), dim=-1)
        cos, sin = emb.cos(), emb.sin()
        if self._scaling != 1.0:
            cos, sin = cos * self._scaling, sin * self._scaling
        self.cos, self.sin = cos.to(self.dtype), sin.to(self.dtype)

    def lookup(self, positions: Positions, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin as ``[n, 1, head_dim]`` (broadcast over heads)."""
        last = positions + n if isinstance(positions, int) else int(positions.max()) + 1
        if last > self.cos.shape[0]:
            self._build(max(last, 2 * self.cos.shape[0]))
        if isinstance(positions, int):
            return self.cos[positions:last, None], self.sin[positions:last, None]
        return self.cos[positions][:, None], self.sin[positions][:, None]


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    dtype = x.dtype
    h = x.to(torch.float32)
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(dtype)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    return (x * cos) + (_rotate_half(x) * sin)


class Qwen2Forward:  # the name predates the Llama family; every supported architecture runs here
    """Stateless apart from the rotary table: ``forward(ids, cache)`` -> logits of chosen rows."""

    def __init__(self, weights: Qwen2Weights, fused: bool | None = None) -> None:
        """``fused``: run norms, rotary and silu * up as one C call each (:mod:`engine.fused`);
        None decides by the weights (low-bit bf16 on CPU: yes; ``none``: no, exact tokens)."""
        self.weights = weights
        self.config = weights.config
        self.rotary = RotaryTable(self.config, weights.dtype, weights.device)
        if fused is None:
            fused = fused_for(weights)
        self.fused = fused
        self.c_attention = fused_ops.attention_like_torch()
        # a decode or verify step of one sequence in one C call where every piece of it runs in C
        # (engine.quant.step); benchmarks turn it off to time the per-operation path beside it
        self.one_call_step = True
        self._decode_step: object = _UNBUILT

    @property
    def decode_step(self) -> "DecodeStep | None":
        """The one-call step (engine.quant.step) when this forward's decode and verify steps can
        take it: fused with the C attention, ``one_call_step`` on, every projection q8/q5."""
        if not (self.fused_attention and self.one_call_step):
            return None
        if self._decode_step is _UNBUILT:
            self._decode_step = DecodeStep(self.weights) if DecodeStep.supports(self.weights) else None
        return self._decode_step

    @property
    def fused_attention(self) -> bool:
        """Whether the decode attention runs in C too (engine.fused.attention_like_torch)."""
        return self.fused and self.c_attention

    def _norm(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        if self.fused:
            return fused_ops.rms_norm(x, weight, self.config.rms_eps)
        return rms_norm(x, weight, self.config.rms_eps)

    def hidden(self, input_ids: torch.Tensor, cache: AttentionCache) -> torch.Tensor:
        """Residual-stream states ``[n, hidden]`` (before the final norm) for ``input_ids [n]``."""
        cfg, w = self.config, self.weights
        n = input_ids.shape[0]
        positions = cache.begin(n)
        cos, sin = self.rotary.lookup(positions, n)
        x = w.embed_tokens(input_ids)
        k_end = cfg.q_size + cfg.kv_size
        spec = cfg.spec
        for index, layer in enumerate(w.layers):
            qkv = layer.qkv(self._norm(x, layer.input_norm))
            if layer.q_norm is not None:
                self._norm_heads(qkv, layer.q_norm, layer.k_norm)
            q, k = self._rotate(qkv, n, cos, sin)
            v = qkv[:, k_end:].view(n, cfg.num_kv_heads, cfg.head_dim)
            window = spec.window(index)
            out = cache.attend(index, q, k, v) if window is None else cache.attend(index, q, k, v, window=window)
            x.add_(layer.o(out))  # residual, in place: x is ours
            gate_up = layer.gate_up(self._norm(x, layer.post_norm))
            x.add_(layer.down(self._silu_mul(gate_up)))
        cache.commit(n)
        return x

    def _norm_heads(self, qkv: torch.Tensor, q_norm: torch.Tensor, k_norm: torch.Tensor) -> None:
        """Qwen3's RMSNorm over each q and k head (before the rotary), in place in ``qkv``."""
        cfg = self.config
        n, q_size, k_end = qkv.shape[0], cfg.q_size, cfg.q_size + cfg.kv_size
        for begin, end, weight in ((0, q_size, q_norm), (q_size, k_end, k_norm)):
            heads = qkv[:, begin:end].reshape(-1, cfg.head_dim)
            qkv[:, begin:end] = self._norm(heads, weight).view(n, end - begin)

    def _rotate(self, qkv: torch.Tensor, n: int, cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """q ``[n, heads, d]`` and k ``[n, kv_heads, d]`` of the fused qkv output, rotated. q and
        k sit side by side in qkv: both heads-sets rotate in one pass (in place when fused)."""
        cfg = self.config
        heads, k_end = cfg.num_heads + cfg.num_kv_heads, cfg.q_size + cfg.kv_size
        if self.fused:
            fused_ops.rotary_(qkv, heads, cfg.head_dim, cos, sin)
            qk = qkv[:, :k_end].view(n, heads, cfg.head_dim)
        else:
            qk = apply_rotary(qkv[:, :k_end].view(n, heads, cfg.head_dim), cos, sin)
        return qk[:, :cfg.num_heads], qk[:, cfg.num_heads:]

    def _silu_mul(self, gate_up: torch.Tensor) -> torch.Tensor:
        if self.fused:
            return fused_ops.silu_mul(gate_up)
        gate, up = gate_up.chunk(2, dim=-1)
        return F.silu(gate).mul_(up)

    def head_input(self, hidden: torch.Tensor) -> torch.Tensor:
        """What the lm_head multiplies: the final norm of ``hidden``."""
        return self._norm(hidden, self.weights.norm)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """float32 logits for the given rows (after the final norm), as ``generate`` uses them."""
        return self.weights.lm_head(self.head_input(hidden)).float()

    def __call__(self, input_ids: torch.Tensor, cache: AttentionCache, last_only: bool = True) -> torch.Tensor:
        """Run the new tokens through the model; logits for the last one (or all) ``[m, vocab]``."""
        takes_step = getattr(cache, "takes_decode_step", None)
        if takes_step is not None and takes_step(input_ids.shape[0]):
            step = self.decode_step
            if step is not None:
                return cache.run_decode_step(step, self.weights.embed_tokens(input_ids), self.rotary, last_only)
        x = self.hidden(input_ids, cache)
        return self.logits(x[-1:] if last_only else x)
