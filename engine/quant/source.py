"""The model's weights as its folder stores them, for quantizing from the source values.

Why: the worker runs the model in bf16, so the transformers weights are the stored values
rounded to bf16. The bundled default model is a GGUF dequantized to float32 safetensors, whose
Q5_0 / Q8_0 tensors are exactly ``d * c`` with an fp16 ``d`` per 32 weights: quantized from
those float32 values, ``q8`` holds the GGUF's own numbers (and packs the Q5_0 ones in 5 bits);
from the bf16-rounded ones it would only come close. A folder without safetensors (a hub id
that is not cached) gives None, and the in-memory weights are quantized instead.
"""
from __future__ import annotations

from contextlib import ExitStack
from pathlib import Path
from typing import Any

import torch

_QKV = ("q_proj", "k_proj", "v_proj")
_GATE_UP = ("gate_proj", "up_proj")


class StoredWeights:
    """Tensors of a model folder's safetensors files, read one at a time on request."""

    def __init__(self, source: str | None) -> None:
        folder = Path(source) if source else None
        self._files = sorted(folder.glob("*.safetensors")) if folder and folder.is_dir() else []
        self._stack = ExitStack()
        self._where: dict[str, Any] = {}

    def __enter__(self) -> "StoredWeights":
        if self._files:
            from safetensors import safe_open

            for path in self._files:
                handle = self._stack.enter_context(safe_open(str(path), framework="pt"))
                self._where.update({key: handle for key in handle.keys()})
        return self

    def __exit__(self, *exc: object) -> None:
        self._stack.close()

    def tensor(self, *keys: str) -> torch.Tensor | None:
        """The named tensors concatenated along rows (fused projections), or None if one is missing."""
        if not all(key in self._where for key in keys):
            return None
        return torch.cat([self._where[key].get_tensor(key) for key in keys])

    def projection(self, layer: int, cls: str) -> torch.Tensor | None:
        """The stored weight of a fused projection class (``engine.weights`` names) of ``layer``."""
        attn, mlp = f"model.layers.{layer}.self_attn.", f"model.layers.{layer}.mlp."
        names = {"qkv": [attn + n for n in _QKV], "o": [attn + "o_proj"],
                 "gate_up": [mlp + n for n in _GATE_UP], "down": [mlp + "down_proj"]}[cls]
        return self.tensor(*[name + ".weight" for name in names])
