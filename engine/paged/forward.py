"""A Qwen2 forward over packed tokens of several sequences, with K/V in the paged pool.

It reads the loaded transformers model's weights in place (nothing is copied): embedding,
RMSNorm, q/k/v projections with bias, RoPE (cos/sin from the model's own rotary module, so
scaling variants match), grouped-query attention through :func:`paged_attention`, SwiGLU MLP,
final norm, lm_head (tied or not).  Linear layers and the MLP run once over all packed
tokens of a step; only attention is per sequence, and only each sequence's last token goes
through the final norm and lm_head (the vocabulary projection is the biggest matmul).
"""
from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from engine.paged.attention import PagedBatch, paged_attention
from engine.paged.pool import KVBlockPool, KVGeometry


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Qwen2's RMSNorm: statistics in float32, scale in the input dtype."""
    dtype = x.dtype
    h = x.to(torch.float32)
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(dtype)


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """RoPE on ``[n, heads, dim]`` with ``cos``/``sin`` ``[n, dim]`` (rotate-half layout)."""
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos[:, None] + rotated * sin[:, None]


class PagedQwen2:
    """Runs steps of a Qwen2ForCausalLM whose K/V lives in a :class:`KVBlockPool`."""

    def __init__(self, model: Any):
        self.model = model
        cfg = model.config
        self.config = cfg
        self.geometry = KVGeometry.from_config(cfg)
        self.num_heads = cfg.num_attention_heads
        self.eps = cfg.rms_norm_eps
        self.scale = self.geometry.head_dim ** -0.5
        self._decoder = model.model
        self._layers = list(model.model.layers)

    @property
    def dtype(self) -> torch.dtype:
        return self._decoder.embed_tokens.weight.dtype

    @property
    def device(self) -> torch.device:
        return self._decoder.embed_tokens.weight.device

    def make_pool(self, num_blocks: int, block_size: int) -> KVBlockPool:
        return KVBlockPool(num_blocks, block_size, self.geometry, self.dtype, self.device)

    @torch.inference_mode()
    def forward(self, input_ids: torch.Tensor, batch: PagedBatch, pool: KVBlockPool,
                all_logits: bool = False) -> torch.Tensor:
        """``input_ids`` ``[n_tokens]`` packed as in ``batch``. Writes their K/V into the pool
        and returns logits ``[batch, vocab]`` of each sequence's last token (float32), or of
        every token with ``all_logits``."""
        h = self._decoder.embed_tokens(input_ids)                     # [N, hidden]
        cos, sin = self._decoder.rotary_emb(h[None], batch.positions[None])
        cos, sin = cos[0], sin[0]
        n, dim = h.shape[0], self.geometry.head_dim
        for index, layer in enumerate(self._layers):
            attn = layer.self_attn
            x = rms_norm(h, layer.input_layernorm.weight, self.eps)
            q = F.linear(x, attn.q_proj.weight, attn.q_proj.bias).view(n, self.num_heads, dim)
            k = F.linear(x, attn.k_proj.weight, attn.k_proj.bias).view(n, -1, dim)
            v = F.linear(x, attn.v_proj.weight, attn.v_proj.bias).view(n, -1, dim)
            q, k = rotate(q, cos, sin), rotate(k, cos, sin)
            o = paged_attention(pool, index, batch, q, k, v, self.scale)
            h = h + F.linear(o.reshape(n, -1), attn.o_proj.weight, attn.o_proj.bias)
            x = rms_norm(h, layer.post_attention_layernorm.weight, self.eps)
            mlp = layer.mlp
            gate = F.silu(F.linear(x, mlp.gate_proj.weight)) * F.linear(x, mlp.up_proj.weight)
            h = h + F.linear(gate, mlp.down_proj.weight)
        if not all_logits:
            h = h[batch.last_index]
        h = rms_norm(h, self._decoder.norm.weight, self.eps)
        return self.model.lm_head(h).float()
