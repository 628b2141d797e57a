"""The one error a model that cannot be loaded raises, below every module that can raise it.

It lives apart from :mod:`engine.loader` so that the preparing modules (GGUF reading, the
bundled models) raise it too without importing the loader that imports them.
"""
from __future__ import annotations


class ModelLoadError(RuntimeError):
    """The configured model, device or dtype cannot be used; the message says why."""
