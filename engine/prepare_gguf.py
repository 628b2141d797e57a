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
        gguf = fetch(scratch)
        meta = read_gguf_meta(gguf)
        convert_gguf(meta, out_dir, generation_defaults(meta, overrides))
        if final.exists():
            shutil.rmtree(final)
        os.replace(out_dir, final)
    log_event(logger, "gguf_model_prepared", folder=final.name, architecture=meta.architecture,
              latency_ms=int((time.perf_counter() - started) * 1000))


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
