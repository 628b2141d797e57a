"""The error a worker's start can fail with: its own module, below every module that raises it
(the loader, the architecture description), so neither has to import the other for it."""
from __future__ import annotations


class ModelLoadError(RuntimeError):
    """The configured model, device or dtype cannot be used; the message says why."""


class InsufficientMemoryError(RuntimeError):
    """A request needs more memory than this machine has available now (e.g. ``official`` on a
    GGUF run on its own bits, which needs the model in full precision); the message names how
    much it would take and how much there is. The job fails with it; the worker stays up."""
