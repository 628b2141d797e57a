"""Where the served model's files are and what it is called: one answer for every room.

``MINISERVE_MODEL`` is a bundled model's name (``default``: Qwen2.5-Coder-0.5B-Instruct;
``smollm2-135m``: SmolLM2-135M-Instruct; ``all-minilm-l6-v2``: the bundled sentence-embedding
model), prepared once into ``<cache_dir>/models/<name>``;
the path of a ``.gguf`` file, prepared once into ``<cache_dir>/models/gguf-<sha256>``; a
local folder; or a Hugging Face hub id. The engine loads from here, the web counts prompt
tokens with the tokenizer found here (it never imports the engine), and every room names the
model with :func:`model_id`: the id a request's ``model`` field, ``/v1/models``, the per-model
queues and the workers' heartbeats all use, and with :func:`model_kind` says whether it is a
chat model or an embedding model (a folder holding sentence-transformers' ``modules.json``).
"""
from __future__ import annotations

from pathlib import Path

from core.file_digest import file_sha256
from core.settings import DEFAULT_MODEL, Settings

DEFAULT_MODEL_NAME = "qwen2.5-coder-0.5b-instruct"
SMOLLM2_MODEL = "smollm2-135m"
# MINISERVE_MODEL value -> the name clients see and the prepared folder's name.
BUNDLED_MODELS = {DEFAULT_MODEL: DEFAULT_MODEL_NAME, SMOLLM2_MODEL: "smollm2-135m-instruct"}
# Other names a bundled model answers to: its MINISERVE_MODEL value, Ollama's library name for
# the same weights, and its GGUF file's stem (engine/prepare_default.py names the files).
BUNDLED_ALIASES = {
    DEFAULT_MODEL: (DEFAULT_MODEL, "qwen2.5-coder:0.5b", "qwen2.5-coder-0.5b-instruct-q4_k_m"),
    SMOLLM2_MODEL: (SMOLLM2_MODEL, "smollm2:135m", "SmolLM2-135M-Instruct.Q4_1"),
}
# The bundled embedding model (engine/embedding/source.py): its MINISERVE_MODEL value is its id.
EMBEDDING_MODEL = "all-minilm-l6-v2"
CHAT, EMBEDDING = "chat", "embedding"  # the kinds of model (heartbeats' ``model_kind``)


def bundled_model_dir(cache_dir: Path | str, model: str) -> Path:
    """Where a bundled model (a key of :data:`BUNDLED_MODELS`) is prepared."""
    return Path(cache_dir) / "models" / BUNDLED_MODELS[model]


def default_model_dir(cache_dir: Path | str) -> Path:
    """Where the prepared default model lives."""
    return bundled_model_dir(cache_dir, DEFAULT_MODEL)


def embedding_model_dir(cache_dir: Path | str) -> Path:
    """Where the bundled embedding model is extracted."""
    return Path(cache_dir) / "models" / EMBEDDING_MODEL


def model_kind(model: str) -> str:
    """``embedding`` for the bundled embedding model and for a folder in sentence-transformers'
    layout (``modules.json``), ``chat`` for everything else."""
    if model == EMBEDDING_MODEL:
        return EMBEDDING
    path = Path(model).expanduser()
    return EMBEDDING if (path / "modules.json").is_file() else CHAT


def names_gguf_file(settings: Settings) -> bool:
    """``MINISERVE_MODEL`` is the path of a GGUF file (it need not exist: that is a load error)."""
    return settings.model.lower().endswith(".gguf")


def gguf_model_dir(cache_dir: Path | str, gguf: Path, show_progress: bool = False) -> Path:
    """The prepared folder of a GGUF file, keyed by its content: renaming or moving the file
    reuses it, and a changed file with the same name gets a folder of its own. The digest is
    remembered in ``models/.digests`` so a later start (web or worker) does not read the file."""
    models = Path(cache_dir) / "models"
    return models / f"gguf-{file_sha256(gguf, show_progress, remember_in=models / '.digests')}"


def names_a_folder(settings: Settings) -> bool:
    """``MINISERVE_MODEL`` is a path (an existing folder, or written like one), not a hub id."""
    model = settings.model
    return Path(model).expanduser().is_dir() or model.startswith((".", "/", "~"))


def local_model_dir(settings: Settings) -> Path | None:
    """The model's folder on this machine, when there is one (a hub id has none)."""
    if settings.model in BUNDLED_MODELS:
        return bundled_model_dir(settings.cache_dir, settings.model)
    if settings.model == EMBEDDING_MODEL:
        return embedding_model_dir(settings.cache_dir)
    path = Path(settings.model).expanduser()
    if names_gguf_file(settings):
        return gguf_model_dir(settings.cache_dir, path) if path.is_file() else None
    return path if path.is_dir() else None


def model_id(model: str) -> str:
    """The public id of a ``MINISERVE_MODEL`` value: the bundled model's name, a ``.gguf``
    file's name without the suffix, a folder's own name, or the hub id as written."""
    if model in BUNDLED_MODELS:
        return BUNDLED_MODELS[model]
    path = Path(model).expanduser()
    if model.lower().endswith(".gguf"):
        return path.stem
    if path.is_dir() or model.startswith((".", "/", "~")):
        return path.name or path.resolve().name  # "." names the current folder
    return model


def model_aliases(settings: Settings) -> list[str]:
    """Every other name this process's model answers to (core/models.py resolves them): the
    bundled model's names (:data:`BUNDLED_ALIASES`), then ``MINISERVE_MODEL_ALIASES`` (as
    vLLM's ``--served-model-name``), without repeats or the id itself."""
    own = model_id(settings.model)
    names = [*BUNDLED_ALIASES.get(settings.model, ()), *settings.model_aliases]
    return [name for i, name in enumerate(names) if name != own and name not in names[:i]]


def served_model_name(settings: Settings) -> str:
    """The name clients see for this process's model (:func:`model_id`)."""
    return model_id(settings.model)
