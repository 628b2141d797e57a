"""The loaded Qwen2 model's weights, arranged for the hand-written forward, never copied.

Decoding one token is bound by reading the weights, and every extra matrix multiplication
call costs fixed overhead, so q/k/v run as one multiplication and gate/up as another. To
fuse them *without a second copy*, :func:`fuse_projections` moves q/k/v (and gate/up) into
one new buffer per layer and points the transformers modules' parameters at row slices of
it: the model keeps working unchanged (``official`` included), memory stays the same, and
our forward multiplies by the whole buffer at once.

Each projection is a :class:`Linear`: anything with ``__call__(x) -> y`` will do, which is
the seam where quantized projections plug in (replace ``layer.qkv`` etc.).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch
import torch.nn.functional as F

from engine.quant.restore import restore_full_weights

Projection = Callable[[torch.Tensor], torch.Tensor]


@dataclass
class Linear:
    """``y = x W^T + b`` over weights owned by the loaded model."""

    weight: torch.Tensor
    bias: torch.Tensor | None = None

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight, self.bias)


@dataclass(frozen=True)
class ForwardConfig:
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    rms_eps: float
    rope_theta: float
    tied: bool

    @property
    def q_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim

    @classmethod
    def from_hf(cls, config: Any) -> "ForwardConfig":
        rope = getattr(config, "rope_parameters", None) or {}
        rope_type = rope.get("rope_type", "default")
        if rope_type != "default":
            raise NotImplementedError(f"rope_type {rope_type!r} is not supported by the hand-written forward")
        theta = rope.get("rope_theta", getattr(config, "rope_theta", 10000.0))
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        return cls(vocab_size=config.vocab_size, hidden_size=config.hidden_size,
                   num_layers=config.num_hidden_layers, num_heads=config.num_attention_heads,
                   num_kv_heads=config.num_key_value_heads, head_dim=head_dim,
                   intermediate_size=config.intermediate_size, rms_eps=float(config.rms_norm_eps),
                   rope_theta=float(theta), tied=bool(getattr(config, "tie_word_embeddings", False)))


@dataclass
class LayerWeights:
    input_norm: torch.Tensor
    qkv: Projection  # hidden -> q_size + 2 * kv_size
    o: Projection  # q_size -> hidden
    post_norm: torch.Tensor
    gate_up: Projection  # hidden -> 2 * intermediate
    down: Projection  # intermediate -> hidden


@dataclass
class Qwen2Weights:
    config: ForwardConfig
    embed: Any  # [vocab, hidden] tensor, or a quantized table with lookup/dtype/device (engine.quant)
    layers: list[LayerWeights]
    norm: torch.Tensor
    lm_head: Projection  # hidden -> vocab

    def embed_tokens(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Rows of the embedding table for ``input_ids`` (a new tensor, safe to modify)."""
        if isinstance(self.embed, torch.Tensor):
            return F.embedding(input_ids, self.embed)
        return self.embed.lookup(input_ids)

    @property
    def dtype(self) -> torch.dtype:
        return self.embed.dtype

    @property
    def device(self) -> torch.device:
        return self.embed.device


def _rehome(modules: list[torch.nn.Module], attr: str) -> torch.Tensor | None:
    """Concatenate ``module.<attr>`` along rows into one buffer; point each module at its slice."""
    tensors = [getattr(m, attr) for m in modules]
    if any(t is None for t in tensors):
        return None
    fused = torch.cat([t.detach() for t in tensors], dim=0)
    start = 0
    for module, tensor in zip(modules, tensors):
        rows = tensor.shape[0]
        setattr(module, attr, torch.nn.Parameter(fused[start:start + rows], requires_grad=False))
        start += rows
    return fused


def _fused_linear(modules: list[torch.nn.Module]) -> Linear:
    """One Linear over the rows of all ``modules``; reused when they were fused before."""
    previous = getattr(modules[0], "_miniserve_fused", None)
    if previous is not None and modules[0].weight.data_ptr() == previous.weight.data_ptr():
        return previous
    linear = Linear(_rehome(modules, "weight"), _rehome(modules, "bias"))
    modules[0]._miniserve_fused = linear
    return linear


def fuse_projections(model: Any) -> Qwen2Weights:
    """Arrange ``model``'s weights for :mod:`engine.forward` (idempotent, no extra memory).
    Weights a quantized or packed setting freed are reloaded first (engine.quant.restore)."""
    restore_full_weights(model)
    config = ForwardConfig.from_hf(model.config)
    inner = model.model
    layers = []
    for layer in inner.layers:
        attn, mlp = layer.self_attn, layer.mlp
        layers.append(LayerWeights(
            input_norm=layer.input_layernorm.weight.detach(),
            qkv=_fused_linear([attn.q_proj, attn.k_proj, attn.v_proj]),
            o=Linear(attn.o_proj.weight.detach(), None if attn.o_proj.bias is None else attn.o_proj.bias.detach()),
            post_norm=layer.post_attention_layernorm.weight.detach(),
            gate_up=_fused_linear([mlp.gate_proj, mlp.up_proj]),
            down=Linear(mlp.down_proj.weight.detach())))
    return Qwen2Weights(config=config, embed=inner.embed_tokens.weight.detach(), layers=layers,
                        norm=inner.norm.weight.detach(), lm_head=Linear(model.lm_head.weight.detach()))
