"""The error a worker's start can fail with: its own module, below every module that raises it
(the loader, the architecture description), so neither has to import the other for it."""
from __future__ import annotations


class ModelLoadError(RuntimeError):
    """The configured model, device or dtype cannot be used; the message says why."""
