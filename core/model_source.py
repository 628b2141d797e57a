"""Where the served model's files are and what it is called: one answer for every room.

``MINISERVE_MODEL`` is ``default`` (the bundled Qwen2.5-Coder-0.5B-Instruct, prepared once
into ``<cache_dir>/models/<name>``), a local folder, or a Hugging Face hub id. The engine
loads from here, the web counts prompt tokens with the tokenizer found here (it never
imports the engine), and the OpenAI routes name the model the same way.
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


def served_model_name(settings: Settings) -> str:
    """The name clients see: the bundled model's, a folder's own name, or the hub id."""
    if settings.model == DEFAULT_MODEL:
        return DEFAULT_MODEL_NAME
    if names_a_folder(settings):
        return Path(settings.model).expanduser().name
    return settings.model
