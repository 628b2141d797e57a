"""Load the model named by the settings: a bundled model, a ``.gguf`` file, a folder or a hub id.

Decisions made here, once per process:
- device: ``auto`` picks CUDA when present, else CPU; an explicit ``cuda`` without CUDA is an
  error (never a silent fallback to CPU).
- dtype: ``auto`` is bfloat16 on CPU (measured faster here: memory-bound decoding reads half
  the bytes; see docs/engine.md) and bfloat16 on CUDA.
- threads: ``MINISERVE_THREADS > 0`` sets ``torch.set_num_threads``.
- quantization: ``MINISERVE_QUANT`` (``auto``: ``q8`` for a bf16 model on CPU, ``none`` on
  CUDA or in float32; see :func:`apply_quant` and docs/quantization.md). ``gguf`` runs a
  quantized GGUF from its mapped file instead (:func:`load_gguf_native`): the folder gets the
  description only, never weights; ``auto`` does too for a file of mostly K-format blocks or
  one too large for q8's preparation (:func:`engine.gguf_weights.auto_declines`).
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from core.logs import log_event
from core.model_source import (BUNDLED_MODELS, gguf_model_dir, local_model_dir, names_a_folder, names_gguf_file,
                               served_model_name)
from core.settings import Settings
from engine.architecture import ModelSpec, model_spec
from engine.errors import ModelLoadError
from engine.packed import packing_available, release_freed_memory
from engine.gguf_index import read_index
from engine.gguf_model import GGUFModel, available_bytes
from engine.gguf_weights import auto_declines, native_refusal, read_gguf_weights
from engine.prepare_default import prepare_bundled_gguf, prepare_bundled_model
from engine.prepare_gguf import prepare_gguf_description, prepare_gguf_folder
from engine.quant.kernels import QuantKernelError
from engine.quant.model import decide_prefill_paths, forward_weights, pack_model, quantize_model
from engine.quant.plan import GGUF, QUANT_CHOICES, auto_runs_gguf, resolve_quant

logger = logging.getLogger("miniserve.engine.loader")


__all__ = ["LoadedModel", "ModelLoadError", "load_model", "resolve_model_path"]


@dataclass
class LoadedModel:
    model: Any  # a transformers *ForCausalLM of a supported architecture (engine.architecture), eval mode;
                # for a GGUF run on its own bits, an engine.gguf_model.GGUFModel
    tokenizer: Any
    name: str
    path: str
    device: Any  # torch.device
    dtype: Any  # torch.dtype
    load_s: float
    quant: str = "none"
    spec: ModelSpec | None = None  # the architecture description the forward runs by

    @property
    def eos_ids(self) -> list[int]:
        eos = self.model.generation_config.eos_token_id
        if eos is None:
            eos = self.tokenizer.eos_token_id
        return [int(e) for e in (eos if isinstance(eos, (list, tuple)) else [eos]) if e is not None]

    @property
    def default_repetition_penalty(self) -> float:
        value = getattr(self.model.generation_config, "repetition_penalty", None)
        return float(value) if value is not None else 1.0


def resolve_device(choice: str) -> Any:
    import torch

    if choice == "cuda":
        if not torch.cuda.is_available():
            raise ModelLoadError("MINISERVE_DEVICE=cuda but CUDA is not available on this "
                                 "machine (torch built for CPU or no GPU); use auto or cpu")
        return torch.device("cuda")
    if choice == "cpu":
        return torch.device("cpu")
    if choice == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    raise ModelLoadError(f"MINISERVE_DEVICE={choice!r} is not one of auto, cpu, cuda")


def resolve_dtype(choice: str, device: Any) -> Any:
    import torch

    table = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
    if choice == "auto":
        return torch.bfloat16
    if choice not in table:
        raise ModelLoadError(f"MINISERVE_DTYPE={choice!r} is not one of auto, float32, bfloat16, float16")
    return table[choice]


def resolve_model_path(settings: Settings) -> tuple[str, str]:
    """(display name, what from_pretrained gets): a prepared folder (bundled or GGUF), a folder or an id."""
    name = served_model_name(settings)
    if settings.model in BUNDLED_MODELS:
        return name, str(prepare_bundled_model(settings.model, settings))
    if names_gguf_file(settings):
        return name, str(prepare_gguf_file(Path(settings.model).expanduser(), settings))
    folder = local_model_dir(settings)
    if folder is not None:
        if not (folder / "config.json").is_file():
            raise ModelLoadError(f"MINISERVE_MODEL folder {folder} has no config.json")
        return name, str(folder)
    if names_a_folder(settings):
        raise ModelLoadError(f"MINISERVE_MODEL folder {Path(settings.model).expanduser()} does not exist")
    return name, settings.model  # a Hugging Face hub id


def prepare_gguf_file(gguf: Path, settings: Settings) -> Path:
    """A user's GGUF file, prepared once into the cache folder keyed by its sha256."""
    if not gguf.is_file():
        raise ModelLoadError(f"MINISERVE_MODEL file {gguf} does not exist")
    return prepare_gguf_folder(gguf_model_dir(settings.cache_dir, gguf, show_progress=True), lambda scratch: gguf)


def apply_threads(settings: Settings) -> None:
    import torch

    if settings.threads > 0:
        torch.set_num_threads(settings.threads)


def apply_quant(model: Any, setting: str, device: Any, source: str,
                cache_dir: Path | None = None) -> str:
    """Quantize per ``MINISERVE_QUANT``; returns what runs, as ``Engine.info`` shows it.

    An explicit setting whose kernel this CPU/torch lacks is a start error naming the
    variable and the choices. ``auto`` never fails the start, but a fallback to ``none`` is
    said loudly: a WARNING log event and ``none (auto: ...)`` on ``/workers``. ``cache_dir``:
    ``tables/`` keeps a quantized embedding table as a mapped file (only rows in use resident),
    ``quantized/`` the quantized weights of an earlier start (engine.quant.weight_cache)."""
    plan = resolve_quant(setting, device.type, getattr(model, "dtype", None))
    if plan == "none":
        label = "none (auto)" if setting == "auto" else "none"
        if pack_model(model, source):  # bf16 on CPU: oneDNN-packed projections, same bits (engine.packed)
            return label
        return label + _unpacked_note(model, device)
    try:
        quantize_model(model, plan, source=source, table_dir=None if cache_dir is None else cache_dir / "tables",
                       cache_dir=None if cache_dir is None else cache_dir / "quantized")
    except QuantKernelError as exc:
        if setting != "auto":
            raise ModelLoadError(f"{exc}. MINISERVE_QUANT must be one of {', '.join(QUANT_CHOICES)}; "
                                 f"use none on this machine") from exc
        log_event(logger, "quant_fallback", level=logging.WARNING, setting=setting, plan=plan, reason=str(exc))
        return f"none (auto: {plan} kernel unavailable, running full precision)"
    decide_prefill_paths(forward_weights(model))
    return f"{plan} (auto)" if setting == "auto" else plan


def _unpacked_note(model: Any, device: Any) -> str:
    """Where packing should have applied (bf16 on CPU) but did not: say so in the log and on
    ``/workers`` -- the plain path is about half as fast (issue 12: no silent slow code)."""
    import torch

    if device.type != "cpu" or getattr(model, "dtype", None) != torch.bfloat16:
        return ""
    reason = ("no source folder to reload plain weights from" if packing_available(torch.bfloat16, device)
              else "this CPU's oneDNN has no bf16 kernels")
    log_event(logger, "weights_not_packed", level=logging.WARNING, reason=reason)
    return f" (bf16 weights not prepacked: {reason}; about half the decode speed)"


def drop_init_tables(tokenizer: Any) -> Any:
    """Drop the Python copies of the vocabulary and merges a transformers (v5) BPE tokenizer
    keeps after building its Rust tokenizer from them: nothing reads them after ``__init__``,
    and for Qwen2's 151k-entry vocabulary they held ~60 MB of a worker's memory (the Rust
    tokenizer has its own copy, which encodes and decodes)."""
    for name in ("_vocab", "_merges"):
        table = getattr(tokenizer, name, None)
        if isinstance(table, (dict, list)) and table:
            setattr(tokenizer, name, type(table)())
    return tokenizer


def is_gguf_source(settings: Settings) -> bool:
    """The model comes from a GGUF file: a bundled model or a ``.gguf`` path."""
    return settings.model in BUNDLED_MODELS or names_gguf_file(settings)


def native_gguf(settings: Settings) -> tuple[Path, Path]:
    """(described folder, GGUF file) of a GGUF source, preparing the description if missing."""
    if settings.model in BUNDLED_MODELS:
        return prepare_bundled_gguf(settings.model, settings)
    gguf = Path(settings.model).expanduser()
    if not gguf.is_file():
        raise ModelLoadError(f"MINISERVE_MODEL file {gguf} does not exist")
    folder = gguf_model_dir(settings.cache_dir, gguf, show_progress=True)
    return folder, prepare_gguf_description(folder, lambda scratch: gguf)


def load_model(settings: Settings) -> LoadedModel:
    """Load model + tokenizer onto the chosen device and dtype, in eval mode."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    started = time.perf_counter()
    apply_threads(settings)
    device = resolve_device(settings.device)
    dtype = resolve_dtype(settings.dtype, device)
    if settings.quant == GGUF and not is_gguf_source(settings):
        raise ModelLoadError(f"MINISERVE_QUANT=gguf runs a quantized GGUF file, and MINISERVE_MODEL="
                             f"{settings.model!r} is not one (a .gguf path or a bundled model); "
                             f"MINISERVE_QUANT must be one of {', '.join(QUANT_CHOICES)}")
    if is_gguf_source(settings) and auto_runs_gguf(settings.quant, device.type, dtype):
        loaded = load_gguf_native(settings, device, dtype, started)
        if loaded is not None:
            return loaded
    name, source = resolve_model_path(settings)
    try:
        spec = read_spec(source)   # before the weights: an unsupported model fails in a second
        tokenizer = drop_init_tables(AutoTokenizer.from_pretrained(source))
        model = AutoModelForCausalLM.from_pretrained(source, dtype=dtype)
    except OSError as exc:
        raise ModelLoadError(
            f"cannot load MINISERVE_MODEL={settings.model!r}: {exc}. A hub id needs the Hugging "
            f"Face hub to be reachable; offline, use a bundled model ({', '.join(BUNDLED_MODELS)}), "
            f"a .gguf file or a local folder.") from exc
    model.to(device).eval()
    torch.set_grad_enabled(False)
    quant = apply_quant(model, settings.quant, device, source, Path(settings.cache_dir))
    # The load's transient buffers (the stored float32 tensors read to quantize, the bf16 copies
    # freed after) stay in glibc's heap otherwise: the default q8 model measured 2,435 MB
    # resident after load with 462 MB in use, 907 MB once handed back.
    release_freed_memory()
    load_s = time.perf_counter() - started
    log_event(logger, "model_loaded", model=name, architecture=spec.describe(), device=str(device), dtype=str(dtype).replace("torch.", ""),
              quant=quant, latency_ms=int(load_s * 1000))
    return LoadedModel(model=model, tokenizer=tokenizer, name=name, path=source, device=device,
                       dtype=dtype, load_s=load_s, quant=quant, spec=spec)


def load_gguf_native(settings: Settings, device: Any, dtype: Any, started: float) -> LoadedModel | None:
    """A quantized GGUF run on its own bits from the mapped file (engine.gguf_weights): the
    description from the prepared folder, the transformers model built for ``official`` only
    (engine.gguf_model).
    None when ``auto`` chose it and the file cannot run natively (an F16 file, a type without a
    kernel) or runs faster on q8 (:func:`engine.gguf_weights.auto_declines`): the q8 path then
    runs it; an explicit ``gguf`` fails the start instead of a refusal."""
    from transformers import AutoConfig, AutoTokenizer

    if device.type != "cpu":
        raise ModelLoadError(f"MINISERVE_QUANT=gguf runs on the CPU only (device {device}); "
                             f"MINISERVE_QUANT must be one of {', '.join(QUANT_CHOICES)}")
    name = served_model_name(settings)
    folder, gguf = native_gguf(settings)
    index = read_index(gguf)
    refusal = native_refusal(index) or (auto_declines(index, available_bytes()) if settings.quant == "auto" else None)
    if refusal is not None:
        if settings.quant == GGUF:
            raise ModelLoadError(f"MINISERVE_QUANT=gguf cannot run {gguf.name}: {refusal}; "
                                 f"MINISERVE_QUANT must be one of {', '.join(QUANT_CHOICES)}")
        log_event(logger, "gguf_native_skipped", reason=refusal)
        return None
    spec = read_spec(str(folder))
    tokenizer = drop_init_tables(AutoTokenizer.from_pretrained(folder))
    config = AutoConfig.from_pretrained(folder)
    weights = read_gguf_weights(gguf, config, dtype, Path(settings.cache_dir) / "interleaved")
    decide_prefill_paths(weights)
    model = GGUFModel(folder, config, weights, dtype)
    quant = "gguf (auto)" if settings.quant == "auto" else "gguf"
    release_freed_memory()
    load_s = time.perf_counter() - started
    log_event(logger, "model_loaded", model=name, architecture=spec.describe(), device=str(device),
              dtype=str(dtype).replace("torch.", ""), quant=quant, gguf=str(gguf), latency_ms=int(load_s * 1000))
    return LoadedModel(model=model, tokenizer=tokenizer, name=name, path=str(folder), device=device,
                       dtype=dtype, load_s=load_s, quant=quant, spec=spec)


def read_spec(source: str) -> ModelSpec:
    """The architecture description of the model at ``source`` (its config only); raises
    :class:`engine.architecture.UnsupportedArchitecture` naming what we cannot run."""
    from transformers import AutoConfig

    try:
        config = AutoConfig.from_pretrained(source)
    except ValueError as exc:   # a model_type this transformers does not know either
        raise ModelLoadError(f"cannot read the config of {source}: {exc}") from exc
    return model_spec(config)
