"""Where the served model's files are and what it is called: one answer for every room.

``MINISERVE_MODEL`` is ``default`` (the bundled Qwen2.5-Coder-0.5B-Instruct, prepared once
into ``<cache_dir>/models/<name>``), a local folder, a ``.gguf`` file or a Hugging Face hub
id. The engine loads from here, the web counts prompt tokens with the tokenizer found here
(it never imports the engine), and every room names the model with :func:`model_id`: the
id a request's ``model`` field, ``/v1/models``, the per-model queues and the workers'
heartbeats all use.
"""
from __future__ import annotations

from pathlib import Path

from core.settings import DEFAULT_MODEL, Settings

DEFAULT_MODEL_NAME = "qwen2.5-coder-0.5b-instruct"


def default_model_dir(cache_dir: Path | str) -> Path:
    """Where the prepared default model lives."""
    return Path(cache_dir) / "models" / DEFAULT_MODEL_NAME


def names_a_folder(settings: Settings) -> bool:
    """``MINISERVE_MODEL`` is a path (an existing folder, or written like one), not a hub id."""
    model = settings.model
    return Path(model).expanduser().is_dir() or model.startswith((".", "/", "~"))


def local_model_dir(settings: Settings) -> Path | None:
    """The model's folder on this machine, when there is one (a hub id has none)."""
    if settings.model == DEFAULT_MODEL:
        return default_model_dir(settings.cache_dir)
    folder = Path(settings.model).expanduser()
    return folder if folder.is_dir() else None


def model_id(model: str) -> str:
    """The public id of a ``MINISERVE_MODEL`` value: the bundled model's name, a folder's own
    name, a ``.gguf`` file's name without the suffix, or the hub id as written."""
    if model == DEFAULT_MODEL:
        return DEFAULT_MODEL_NAME
    path = Path(model).expanduser()
    if model.lower().endswith(".gguf"):
        return path.stem
    if path.is_dir() or model.startswith((".", "/", "~")):
        return path.name or path.resolve().name  # "." names the current folder
    return model


def served_model_name(settings: Settings) -> str:
    """The name clients see for this process's model (:func:`model_id`)."""
    return model_id(settings.model)
