"""What the engine holds of a GGUF run on its own bits, and its transformers model, built late.

The engine reads three things from its model object: ``config``, ``generation_config``
(end-of-sequence ids, the repetition penalty) and the forward's weights
(:func:`engine.quant.model.forward_weights`). :class:`GGUFModel` is those three and nothing
more. The transformers model is needed by ``official`` (transformers ``generate``) only, so it
is built on the first ``official`` job, on the loader thread while the loop goes on. Why not at
load: importing a transformers model class pulls in its generation stack, ``torch._dynamo``,
DTensor and sympy, for a method most workers never run. On the Qwen2.5-0.5B-shaped Q4_K_M file,
building it at load held 806 MB after load and took 4.8 s to ready; without it, 692 MB and 2.0 s.

That model must never get a full-precision copy at load either, so it is built from the
prepared folder's config on the ``meta`` device (no memory), its rotary buffers computed for
real, and its norms are the very tensors the hand-written forward uses (shared, not copied).
Every other parameter stays on ``meta``.

``official`` needs the model in full precision: each ``official`` job dequantizes it from
the mapped file into the model (:func:`engine.quant.restore.register_reload`, read on the
loader thread while the loop goes on), only after checking that the machine has the memory
(``MemAvailable``); otherwise the job fails with :class:`InsufficientMemoryError` naming what
it would take. The last ``official`` job running frees them again, as in ``q8``.
"""
from __future__ import annotations

import logging
from concurrent.futures import Future
from pathlib import Path
from typing import Any, Callable

import torch

from core.logs import log_event
from engine.errors import InsufficientMemoryError
from engine.quant.gguf_blocks import BlockWeight, dequantize_rows
from engine.quant.gguf_linear import BlockLinear, Part, part_shape
from engine.quant.model import ATTR
from engine.quant.restore import await_loader, on_loader, register_reload
from engine.weights import Qwen2Weights

logger = logging.getLogger("miniserve.engine.gguf")
# memory left to the rest of the machine after an on-demand full-precision load
RESERVE_BYTES = 512 * 2**20
_SLAB_ROWS = 4096   # rows dequantized at a time: bounds the float32 transient of the big tables


class GGUFModel:
    """The config, generation config and weights of a GGUF run on its own bits; the
    transformers model for ``official`` on demand (:meth:`transformers_model`)."""

    def __init__(self, folder: Path | str, config: Any, weights: Qwen2Weights, dtype: torch.dtype) -> None:
        from transformers import GenerationConfig

        self.config, self.dtype = config, dtype
        self.generation_config = (GenerationConfig.from_pretrained(folder)
                                  if (Path(folder) / "generation_config.json").is_file()
                                  else GenerationConfig.from_model_config(config))
        self.__dict__[ATTR] = weights   # what forward_weights returns
        self._model: Any = None
        self._building: Future | None = None

    def transformers_model(self, wait: Callable[[], None] | None = None) -> Any:
        """The transformers model on ``meta``, built once. With ``wait`` (a solo task's pause,
        on the loop thread) it is built on the loader thread while the loop goes on."""
        if self._model is None:
            if wait is None:
                self._model = self._build()
                return self._model
            building = self._building = self._building or on_loader(self._build)
            await_loader(building, wait)
            self._building = None if self._building is building else self._building
            self._model = self._model or building.result()   # a failed build is tried afresh next time
        return self._model

    def _build(self) -> Any:
        return meta_model(self.config, self.generation_config, self.__dict__[ATTR], self.dtype)


def meta_model(config: Any, generation_config: Any, weights: Qwen2Weights, dtype: torch.dtype) -> Any:
    """The transformers model of ``config`` on ``meta``, tied to ``weights``:
    :func:`engine.quant.model.forward_weights` returns them, its norms are theirs, and the rest
    is loaded for ``official`` on demand."""
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    model.eval()
    _real_buffers(model, config)
    _share_norms(model, weights)
    model.generation_config = generation_config
    model.__dict__[ATTR] = weights
    register_reload(model, meta_parameters(model), lambda: full_precision(model, weights, dtype))
    return model


def meta_parameters(model: Any) -> list[str]:
    """The parameters not in memory (a tied head counts once, as the embedding)."""
    return [name for name, param in model.named_parameters() if param.is_meta]


def _real_buffers(model: Any, config: Any) -> None:
    """The rotary tables, computed on the CPU (they are all a Qwen2/Llama model buffers)."""
    rotary = model.model.rotary_emb
    with torch.device("cpu"):
        model.model.rotary_emb = type(rotary)(config=config)
    left = [name for name, buffer in model.named_buffers() if buffer.is_meta]
    if left:
        raise RuntimeError(f"buffers left on meta: {left}")


def _share_norms(model: Any, weights: Qwen2Weights) -> None:
    def share(module: Any, tensor: torch.Tensor | None) -> None:
        if tensor is not None:
            module.weight = torch.nn.Parameter(tensor, requires_grad=False)

    share(model.model.norm, weights.norm)
    for layer, ours in zip(model.model.layers, weights.layers):
        share(layer.input_layernorm, ours.input_norm)
        share(layer.post_attention_layernorm, ours.post_norm)
        if ours.q_norm is not None:
            share(layer.self_attn.q_norm, ours.q_norm)
            share(layer.self_attn.k_norm, ours.k_norm)


def full_precision_bytes(model: Any) -> int:
    """What :func:`full_precision` allocates: every parameter still on ``meta``."""
    return sum(model.get_parameter(n).numel() * model.get_parameter(n).element_size() for n in meta_parameters(model))


def available_bytes() -> int | None:
    """``MemAvailable`` of /proc/meminfo (None where there is none)."""
    try:
        with open("/proc/meminfo") as handle:
            for line in handle:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def check_memory(needed: int, available: int | None) -> None:
    """Refuse (:class:`InsufficientMemoryError`) when ``needed`` bytes would leave less than
    :data:`RESERVE_BYTES` of ``available``."""
    if available is not None and needed + RESERVE_BYTES > available:
        raise InsufficientMemoryError(
            f"official needs the model's weights in full precision: {needed / 2**20:,.0f} MiB "
            f"(+{RESERVE_BYTES // 2**20} MiB reserve), and this machine has {available / 2**20:,.0f} MiB "
            f"available; use a hand-written method (paged, custom_cache, prefix_cache, no_cache), which "
            f"runs the GGUF's own bits")


def full_precision(model: Any, weights: Qwen2Weights, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """Every meta parameter of ``model``, dequantized from ``weights`` (the mapped file) into
    ``dtype``; checks the machine's memory first. Builds new tensors only (runs on the loader thread)."""
    names = meta_parameters(model)
    needed = full_precision_bytes(model)
    check_memory(needed, available_bytes())
    sources = _sources(weights)
    missing = sorted(set(names) - set(sources))
    if missing:
        raise RuntimeError(f"no GGUF tensor for {missing[:3]}")
    out = {}
    for name in names:
        source = sources[name]
        out[name] = (_dequantized(source, dtype) if not isinstance(source, torch.Tensor)
                     or source.dim() == 2 else source.to(dtype).clone())
    log_event(logger, "gguf_full_precision", tensors=len(out), mb=round(needed / 2**20, 1))
    return out


def _dequantized(part: Part, dtype: torch.dtype) -> torch.Tensor:
    rows, cols = part_shape(part)
    out = torch.empty(rows, cols, dtype=dtype)
    for start in range(0, rows, _SLAB_ROWS):
        stop = min(start + _SLAB_ROWS, rows)
        out[start:stop] = (dequantize_rows(part, start, stop) if isinstance(part, BlockWeight)
                           else part[start:stop].to(torch.float32))
    return out


def _split(linear: BlockLinear, names: list[str], prefix: str) -> dict[str, Any]:
    """``prefix.<name>.weight`` (and ``.bias``) for each part of a fused linear."""
    out: dict[str, Any] = {}
    start = 0
    for name, part in zip(names, linear.parts):
        rows = part_shape(part)[0]
        out[f"{prefix}.{name}.weight"] = part
        if linear.bias is not None:
            out[f"{prefix}.{name}.bias"] = linear.bias[start:start + rows]
        start += rows
    return out


def _sources(weights: Qwen2Weights) -> dict[str, Any]:
    """transformers parameter name -> the part (or 1-D tensor) holding its values."""
    out: dict[str, Any] = {"model.embed_tokens.weight": weights.embed.table,
                           "lm_head.weight": weights.lm_head.parts[0]}
    for i, layer in enumerate(weights.layers):
        attn, mlp = f"model.layers.{i}.self_attn", f"model.layers.{i}.mlp"
        out.update(_split(layer.qkv, ["q_proj", "k_proj", "v_proj"], attn))
        out.update(_split(layer.o, ["o_proj"], attn))
        out.update(_split(layer.gate_up, ["gate_proj", "up_proj"], mlp))
        out.update(_split(layer.down, ["down_proj"], mlp))
    return out
