"""The loaded model's weights, arranged for the hand-written forward, never copied.

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

from engine.architecture import ModelSpec, UnsupportedArchitecture, model_spec
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
    """Shapes, plus the architecture description (:class:`engine.architecture.ModelSpec`)."""

    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    spec: ModelSpec

    @property
    def q_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim

    @property
    def rms_eps(self) -> float:
        return self.spec.rms_eps

    @property
    def tied(self) -> bool:
        return self.spec.tied

    @classmethod
    def from_hf(cls, config: Any) -> "ForwardConfig":
        """Raises :class:`engine.architecture.UnsupportedArchitecture` for a model we cannot run."""
        spec = model_spec(config)
        return cls(vocab_size=config.vocab_size, hidden_size=config.hidden_size,
                   num_layers=config.num_hidden_layers, num_heads=spec.num_heads,
                   num_kv_heads=spec.num_kv_heads, head_dim=spec.head_dim,
                   intermediate_size=config.intermediate_size, spec=spec)


@dataclass
class LayerWeights:
    input_norm: torch.Tensor
    qkv: Projection  # hidden -> q_size + 2 * kv_size
    o: Projection  # q_size -> hidden
    post_norm: torch.Tensor
    gate_up: Projection  # hidden -> 2 * intermediate
    down: Projection  # intermediate -> hidden
    q_norm: torch.Tensor | None = None  # [head_dim] RMSNorm weight of each q head (Qwen3), else None
    k_norm: torch.Tensor | None = None


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


def _linear(module: torch.nn.Module) -> Linear:
    return Linear(module.weight.detach(), None if module.bias is None else module.bias.detach())


def _head_norm(attn: torch.nn.Module, name: str) -> torch.Tensor | None:
    norm = getattr(attn, name, None)
    return None if norm is None else norm.weight.detach()


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
            o=_linear(attn.o_proj),
            post_norm=layer.post_attention_layernorm.weight.detach(),
            gate_up=_fused_linear([mlp.gate_proj, mlp.up_proj]),
            down=_linear(mlp.down_proj),
            q_norm=_head_norm(attn, "q_norm"), k_norm=_head_norm(attn, "k_norm")))
    if any((layer.q_norm is not None) != config.spec.qk_norm for layer in layers):
        raise UnsupportedArchitecture(f"{config.spec.model_type}: the config says qk_norm={config.spec.qk_norm}, "
                                      f"the loaded layers disagree")
    return Qwen2Weights(config=config, embed=inner.embed_tokens.weight.detach(), layers=layers,
                        norm=inner.norm.weight.detach(), lm_head=Linear(model.lm_head.weight.detach()))
