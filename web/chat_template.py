"""The model's chat template, rendered in the web with jinja2 as transformers renders it.

The web holds no model and no transformers: the prefix router (system block of a prompt)
and ``/tokenize`` (whole chat prompts) render the template from the prepared model folder
with the same jinja settings transformers uses (sandboxed, ``trim_blocks``,
``lstrip_blocks``, loop controls, a ``tojson`` that keeps non-ASCII text).
"""
from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any


class TemplateError(ValueError):
    """The template refused the messages (its own ``raise_exception``)."""


@functools.lru_cache(maxsize=4)
def load_chat_template(folder: Path | None) -> Any | None:
    """A compiled jinja template, or ``None`` when the folder has no chat template."""
    source = _template_source(folder) if folder else None
    return compile_template(source) if source is not None else None


@functools.lru_cache(maxsize=16)
def compile_template(source: str) -> Any:
    """Template source (a model folder's, or what a worker published) compiled as transformers does."""
    from jinja2.ext import loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    env.filters["tojson"] = lambda value, **kw: json.dumps(value, ensure_ascii=False, **kw)
    env.globals["raise_exception"] = _raise
    return env.from_string(source)


def _raise(message: str) -> None:
    raise TemplateError(message)


def _template_source(folder: Path) -> str | None:
    jinja_file = folder / "chat_template.jinja"
    if jinja_file.is_file():
        return jinja_file.read_text(encoding="utf-8")
    try:
        config = json.loads((folder / "tokenizer_config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    template = config.get("chat_template")
    return template if isinstance(template, str) else None
