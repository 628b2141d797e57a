"""Activation statistics for activation-aware rounding, from the calibration set in data/.

AWQ's observation: a weight column matters in proportion to how large the activations that
multiply it are. :func:`input_importance` runs the full-precision hand-written forward over
``data/quant_calibration.json`` (a few hundred tokens of English, Chinese and code, none
of the benchmark prompts) with every projection wrapped by a recorder, and returns, per
projection, the mean squared input of each column. :func:`engine.quant.rounding.refine_int4`
minimises the rounding error weighted by it. Costs one prefill per text at load, without the head's logits (~1-3 s with bf16
GEMM kernels, ~30 s without: AVX2 CPUs).
"""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import torch

from engine.kv_cache import NoCache
from engine.quant.plan import PROJECTIONS
from engine.weights import Qwen2Weights

CALIBRATION_FILE = Path(__file__).resolve().parents[2] / "data" / "quant_calibration.json"


class _Recorder:
    """A projection that also sums the squares of its inputs, per column."""

    def __init__(self, projection: Any) -> None:
        self.projection = projection
        self.sum_sq: torch.Tensor | None = None
        self.rows = 0

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        self.record(x)
        return self.projection(x)

    def record(self, x: torch.Tensor) -> None:
        x2d = x.reshape(-1, x.shape[-1]).float()
        squares = x2d.pow(2).sum(0)
        self.sum_sq = squares if self.sum_sq is None else self.sum_sq + squares
        self.rows += x2d.shape[0]

    def mean(self) -> torch.Tensor:
        return self.sum_sq / max(self.rows, 1)


def calibration_texts(path: Path = CALIBRATION_FILE) -> list[str]:
    return json.loads(path.read_text(encoding="utf-8"))["texts"]


def input_importance(weights: Qwen2Weights, tokenizer: Any, texts: list[str] | None = None,
                     ) -> dict[str, list[torch.Tensor] | torch.Tensor]:
    """{class: [per-layer mean squared input [K]]} for the projections, ``lm_head``: [K]."""
    from engine.forward import Qwen2Forward

    recorders = [{p: _Recorder(getattr(layer, p)) for p in PROJECTIONS} for layer in weights.layers]
    head = _Recorder(weights.lm_head)
    wrapped = dataclasses.replace(weights, layers=[
        dataclasses.replace(layer, **recs) for layer, recs in zip(weights.layers, recorders)])
    forward = Qwen2Forward(wrapped)
    with torch.inference_mode():
        for text in texts if texts is not None else calibration_texts():
            ids = tokenizer(text)["input_ids"]
            hidden = forward.hidden(torch.tensor(ids, dtype=torch.long, device=weights.device), NoCache())
            # the head's inputs are all it needs: its logits for every position (a third of
            # the compute, several times more without bf16 GEMM kernels) were thrown away
            head.record(forward.head_input(hidden))
    out: dict[str, Any] = {p: [recs[p].mean() for recs in recorders] for p in PROJECTIONS}
    out["lm_head"] = head.mean()
    return out
