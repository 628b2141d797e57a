"""What the hand-written forward needs to know about a model's architecture, read once from
its transformers config (``config.json``, or a config derived from GGUF metadata).

Why one description: the forward, the paged and quantized paths and the one-call C step all
branch on the same few facts (q/k RMSNorm, rotary scaling, sliding window, which biases
exist). Reading them in one place, and refusing a model whose facts we do not handle, is
what turns "loads, then gives wrong tokens" into a clear start error.

Supported: see :data:`SUPPORTED`. Biases need no flag of their own: the forward adds whatever
bias tensors the loaded projections carry; the flags here are for the start log and
``/workers``.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from engine.errors import ModelLoadError

# model_type -> what distinguishes it (for the error message and the docs)
SUPPORTED = {
    "qwen2": "Qwen2 / Qwen2.5: q/k/v bias",
    "qwen3": "Qwen3 dense: q/k RMSNorm, no q/k/v bias",
    "llama": "Llama 2 / 3.x, SmolLM2: optional attention/MLP bias, rope scaling linear or llama3",
    "mistral": "Mistral: sliding-window attention",
}
ROPE_TYPES = ("default", "linear", "llama3")


class UnsupportedArchitecture(ModelLoadError):
    """The model's architecture (or one feature of it) is not one the hand-written forward runs."""


@dataclass(frozen=True)
class ModelSpec:
    """The architecture facts the forward is driven by (shapes stay in engine.weights.ForwardConfig)."""

    model_type: str
    rms_eps: float
    head_dim: int
    num_heads: int
    num_kv_heads: int
    qkv_bias: bool
    o_bias: bool
    mlp_bias: bool
    qk_norm: bool               # RMSNorm over each q and k head before the rotary (Qwen3)
    rope_type: str              # one of ROPE_TYPES
    inv_freq: tuple[float, ...]  # the rotary inverse frequencies, as transformers computes them
    rope_scaling: float         # factor on cos/sin (1.0 for every rope type supported)
    tied: bool
    sliding_window: int | None = None    # keys older than this many positions are not attended
    window_layers: tuple[int, ...] = ()  # the layers that attend within the window

    def window(self, layer: int) -> int | None:
        """The sliding window of ``layer``, or None where it attends over the whole context."""
        return self.sliding_window if layer in self.window_layers else None

    @property
    def c_step_ok(self) -> bool:
        """Whether the one-call C step (engine.quant.step, native/step.c) computes this model:
        it has no q/k norm and no sliding window."""
        return not self.qk_norm and self.sliding_window is None

    def describe(self) -> str:
        """One line for logs and ``/workers``."""
        parts = [self.model_type, f"rope={self.rope_type}", "tied" if self.tied else "untied",
                 f"gqa={self.num_heads}:{self.num_kv_heads}"]
        parts += [name for name, on in (("qkv_bias", self.qkv_bias), ("qk_norm", self.qk_norm)) if on]
        if self.sliding_window is not None:
            parts.append(f"window={self.sliding_window}x{len(self.window_layers)}layers")
        return " ".join(parts)


def unsupported(what: str) -> UnsupportedArchitecture:
    return UnsupportedArchitecture(
        f"{what}; the hand-written forward supports model_type {', '.join(SUPPORTED)} "
        f"(rope_type {', '.join(ROPE_TYPES)}, silu MLP). Serving such a model through transformers "
        f"alone (official only) is not offered: every worker runs the hand-written methods")


def model_spec(config: Any) -> ModelSpec:
    """The description of a transformers ``config``; :class:`UnsupportedArchitecture` if we
    cannot run it exactly."""
    model_type = getattr(config, "model_type", None)
    if model_type not in SUPPORTED:
        raise unsupported(f"model_type {model_type!r} is not supported")
    act = getattr(config, "hidden_act", "silu")
    if act != "silu":
        raise unsupported(f"{model_type} with hidden_act {act!r} is not supported")
    if float(getattr(config, "partial_rotary_factor", 1.0) or 1.0) != 1.0:
        raise unsupported(f"{model_type} with partial_rotary_factor is not supported")
    rope_type, inv_freq, scaling = _rope(config, model_type)
    heads = config.num_attention_heads
    attention_bias = bool(getattr(config, "attention_bias", False))
    window, layers = _sliding_window(config, model_type)
    return ModelSpec(
        model_type=model_type, rms_eps=float(config.rms_norm_eps),
        head_dim=getattr(config, "head_dim", None) or config.hidden_size // heads, num_heads=heads,
        num_kv_heads=getattr(config, "num_key_value_heads", None) or heads,
        qkv_bias=model_type == "qwen2" or attention_bias,
        o_bias=attention_bias and model_type in ("llama", "qwen3"),
        mlp_bias=bool(getattr(config, "mlp_bias", False)), qk_norm=model_type == "qwen3",
        rope_type=rope_type, inv_freq=inv_freq, rope_scaling=scaling,
        tied=bool(getattr(config, "tie_word_embeddings", False)), sliding_window=window, window_layers=layers)


def _rope(config: Any, model_type: str) -> tuple[str, tuple[float, ...], float]:
    """(rope type, inverse frequencies, cos/sin factor) from transformers' own rope function,
    so the rotary table equals the one ``generate`` uses bit for bit."""
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    params = getattr(config, "rope_parameters", None) or {}
    per_layer = isinstance(params, dict) and "rope_type" not in params and any(isinstance(v, dict) for v in params.values())
    if per_layer or not isinstance(params, dict):
        raise unsupported(f"{model_type} with per-layer rope parameters is not supported")
    rope_type = params.get("rope_type", "default")
    if rope_type not in ROPE_TYPES:
        raise unsupported(f"{model_type} with rope_type {rope_type!r} is not supported")
    if rope_type == "default":
        inv_freq, scaling = _default_inv_freq(config, params)
    else:
        inv_freq, scaling = ROPE_INIT_FUNCTIONS[rope_type](config, "cpu")
    return rope_type, tuple(float(f) for f in inv_freq.tolist()), float(scaling)


def _default_inv_freq(config: Any, params: dict) -> tuple[Any, float]:
    """Unscaled rotary frequencies, as transformers' default rope computes them."""
    import torch

    base = params.get("rope_theta", getattr(config, "rope_theta", 10000.0))
    dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    return 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.float) / dim)), 1.0


def _sliding_window(config: Any, model_type: str) -> tuple[int | None, tuple[int, ...]]:
    """(window, layers that use it): Mistral windows every layer when ``sliding_window`` is
    set; Qwen2/3 name theirs in ``layer_types``; Llama has none."""
    window = getattr(config, "sliding_window", None)
    if model_type == "llama" or not window:
        return None, ()
    if model_type == "mistral":
        return int(window), tuple(range(config.num_hidden_layers))
    types = getattr(config, "layer_types", None) or []
    layers = tuple(i for i, kind in enumerate(types) if kind == "sliding_attention")
    return (int(window), layers) if layers else (None, ())
