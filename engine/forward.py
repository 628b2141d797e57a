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
implement it. The small operations between the linears (RMSNorm, rotary, silu * up) and the
caches' attention are those of one :class:`~engine.ops.interface.SmallOps`, chosen once per
forward (:func:`engine.ops.choose.small_ops_for`); full-precision weights get torch's, which
follow transformers' Qwen2 so greedy outputs match token for token. The rotary tables are
computed in float32 and cast to the model dtype.
"""
from __future__ import annotations

from typing import Protocol

import torch

from engine.ops.choose import small_ops_for, whole_step_for
from engine.ops.interface import SmallOps
from engine.quant.step import DecodeStep
from engine.weights import ForwardConfig, Qwen2Weights

Positions = int | torch.Tensor
_UNBUILT = object()


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


class Qwen2Forward:  # the name predates the Llama family; every supported architecture runs here
    """Stateless apart from the rotary table: ``forward(ids, cache)`` -> logits of chosen rows."""

    def __init__(self, weights: Qwen2Weights, ops: SmallOps | None = None) -> None:
        """``ops``: the small operations to run (None: those the weights call for)."""
        self.weights = weights
        self.config = weights.config
        self.rotary = RotaryTable(self.config, weights.dtype, weights.device)
        self.ops = small_ops_for(weights) if ops is None else ops
        # a decode or verify step of one sequence in one C call where the ops hand one out
        # (engine.ops.choose.whole_step_for); tests turn it off to compare the per-operation path
        self.one_call_step = True

    @property
    def ops(self) -> SmallOps:
        return self._ops

    @ops.setter
    def ops(self, ops: SmallOps) -> None:
        self._ops = ops
        self._decode_step: object = _UNBUILT   # the whole-step kernel goes with the ops

    @property
    def decode_step(self) -> "DecodeStep | None":
        """The one-call step (engine.quant.step) when this forward's decode and verify steps can
        take it: ``one_call_step`` on and the chooser hands one out for these ops and weights."""
        if not self.one_call_step:
            return None
        if self._decode_step is _UNBUILT:
            self._decode_step = whole_step_for(self.weights, self._ops)
        return self._decode_step

    def _norm(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        return self._ops.rms_norm(x, weight, self.config.rms_eps)

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
            q, k = self._rotate(qkv, cos, sin)
            v = qkv[:, k_end:].view(n, cfg.num_kv_heads, cfg.head_dim)
            window = spec.window(index)
            out = cache.attend(index, q, k, v) if window is None else cache.attend(index, q, k, v, window=window)
            x.add_(layer.o(out))  # residual, in place: x is ours
            gate_up = layer.gate_up(self._norm(x, layer.post_norm))
            x.add_(layer.down(self._ops.silu_mul(gate_up)))
        cache.commit(n)
        return x

    def _norm_heads(self, qkv: torch.Tensor, q_norm: torch.Tensor, k_norm: torch.Tensor) -> None:
        """Qwen3's RMSNorm over each q and k head (before the rotary), in place in ``qkv``."""
        cfg = self.config
        n, q_size, k_end = qkv.shape[0], cfg.q_size, cfg.q_size + cfg.kv_size
        for begin, end, weight in ((0, q_size, q_norm), (q_size, k_end, k_norm)):
            heads = qkv[:, begin:end].reshape(-1, cfg.head_dim)
            qkv[:, begin:end] = self._norm(heads, weight).view(n, end - begin)

    def _rotate(self, qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """q ``[n, heads, d]`` and k ``[n, kv_heads, d]`` of the fused qkv output, rotated. q and
        k sit side by side in qkv: both heads-sets rotate in one pass."""
        cfg = self.config
        qk = self._ops.rotary(qkv, cfg.num_heads + cfg.num_kv_heads, cfg.head_dim, cos, sin)
        return qk[:, :cfg.num_heads], qk[:, cfg.num_heads:]

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
