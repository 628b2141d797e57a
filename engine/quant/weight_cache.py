"""Quantized weights kept on disk, so that a worker's start reads them rather than quantizing.

Why: quantizing the default model (``q8.quantize`` and ``pack5`` over ~500M weights, in torch)
took 11.5 s of a 15 s start on a 2-core Xeon, paid again at every worker start, restart after a
crash and scale-out. The result depends only on the stored weights, the plan and the kernel's
layout (whether 5-bit packing is used depends on the CPU's vector path), so it is written once
to ``<cache_dir>/quantized/<key>.safetensors`` and read back at the next start.

The key hashes a format version, the plan, the vector path, the model dtype, and the name,
size and modification time of each safetensors and config file of the model folder: a changed
folder, another layout or another CPU path gets a new file, never a stale one. A file that
cannot be read or does not fit the model is ignored (logged) and written afresh. Only a model
folder is cached; a hub id without local files quantizes at each start. Deleting the folder
is always safe.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import tempfile
from pathlib import Path
from typing import Any

import torch

from core.logs import log_event
from engine.quant import native, q8
from engine.quant.layer import QuantizedEmbedding, QuantizedLinear
from engine.quant.plan import PROJECTIONS, QuantPlan
from engine.weights import Qwen2Weights

logger = logging.getLogger("miniserve.engine.quant")
FORMAT = 1  # bump when the stored layout (q8.interleave, pack5, the fields below) changes
_KEYED_FILES = ("*.safetensors", "config.json")


def cache_path(directory: Path | None, plan: QuantPlan, source: str | None, dtype: torch.dtype) -> Path | None:
    """Where these weights' quantized file belongs, or None when they are not cached."""
    folder = Path(source) if source else None
    if directory is None or folder is None or not folder.is_dir():
        return None
    files = sorted(p for pattern in _KEYED_FILES for p in folder.glob(pattern))
    if not any(p.suffix == ".safetensors" for p in files):
        return None
    stats = [(str(p.resolve()), p.stat().st_size, p.stat().st_mtime_ns) for p in files]
    identity = json.dumps({"format": FORMAT, "plan": dataclasses.asdict(plan), "vector_path": native.vector_path(),
                           "dtype": str(dtype), "files": stats})
    return Path(directory) / f"{hashlib.sha256(identity.encode()).hexdigest()[:32]}.safetensors"


def _linears(weights: Qwen2Weights) -> dict[str, Any]:
    out = {f"layers.{i}.{p}": getattr(layer, p) for i, layer in enumerate(weights.layers) for p in PROJECTIONS}
    out["lm_head"] = weights.lm_head
    return out


def write(path: Path, quantized: Qwen2Weights, summary: dict[str, Any]) -> None:
    """Store ``quantized``'s low-bit tensors (atomically: a reader never sees half a file)."""
    from safetensors.torch import save_file

    tensors, modes = {}, {}
    for name, linear in _linears(quantized).items():
        tensors[f"{name}.qweight"], tensors[f"{name}.params"] = linear.qweight, linear.params
        modes[name] = linear.mode
    embed = quantized.embed
    meta: dict[str, Any] = {"modes": modes, "summary": summary, "embed": None}
    if isinstance(embed, QuantizedEmbedding):
        tensors["embed.qweight"], tensors["embed.scales"] = embed.qweight, embed.scales
        meta["embed"] = {"hidden": embed.hidden, "packed5": embed.packed5}
    tmp: str | None = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        handle, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
        os.close(handle)
        save_file({k: v.contiguous() for k, v in tensors.items()}, tmp, metadata={"miniserve": json.dumps(meta)})
        os.replace(tmp, path)
    except OSError as exc:  # a read-only or full disk: the worker still starts, it quantizes next time too
        log_event(logger, "quantized_cache_not_written", level=logging.WARNING, path=str(path), error=str(exc))
        if tmp is not None:
            Path(tmp).unlink(missing_ok=True)


def read(path: Path, weights: Qwen2Weights) -> tuple[Qwen2Weights, dict[str, Any]] | None:
    """``weights`` with the stored low-bit projections (their biases are ``weights``' own), and
    the stored summary; None when there is no usable file."""
    if not path.is_file():
        return None
    from safetensors import safe_open

    try:
        with safe_open(str(path), framework="pt") as handle:
            meta = json.loads(handle.metadata()["miniserve"])
            # copies in the heap: the file's tensors are views of one mapping of the whole file, whose
            # read pages would stay resident beside the embedding's own mapped table (engine.quant.mapped)
            tensors = {key: handle.get_tensor(key).clone() for key in handle.keys()}
        return _rebuild(weights, tensors, meta), meta["summary"]
    except Exception as exc:  # noqa: BLE001 - any unreadable or mismatched file is a miss, not a start error
        log_event(logger, "quantized_cache_ignored", level=logging.WARNING, path=str(path),
                  error=f"{type(exc).__name__}: {exc}")
        return None


def _rebuild(weights: Qwen2Weights, tensors: dict[str, torch.Tensor], meta: dict[str, Any]) -> Qwen2Weights:
    def linear(name: str, full: Any) -> QuantizedLinear:
        out_features, in_features = full.weight.shape
        params = tensors[f"{name}.params"]
        if params.shape[0] != out_features or params.shape[1] * q8.GROUP < in_features:
            raise ValueError(f"{name}: stored shape {tuple(params.shape)} does not fit [{out_features}, {in_features}]")
        bias = None if full.bias is None else full.bias.detach()
        return QuantizedLinear(mode=meta["modes"][name], in_features=in_features, out_features=out_features,
                               qweight=tensors[f"{name}.qweight"], params=params, group_size=q8.GROUP, bias=bias,
                               kernel_bias=None if bias is None else bias.float().contiguous())

    layers = [dataclasses.replace(layer, **{p: linear(f"layers.{i}.{p}", getattr(layer, p)) for p in PROJECTIONS})
              for i, layer in enumerate(weights.layers)]
    embed = weights.embed
    if meta["embed"] is not None:
        embed = QuantizedEmbedding(tensors["embed.qweight"], tensors["embed.scales"], weights.embed.dtype,
                                   meta["embed"]["hidden"], meta["embed"]["packed5"])
        if embed.shape != weights.embed.shape:
            raise ValueError(f"embedding: stored shape {tuple(embed.shape)} is not {tuple(weights.embed.shape)}")
    return dataclasses.replace(weights, layers=layers, lm_head=linear("lm_head", weights.lm_head), embed=embed)
