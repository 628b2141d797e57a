"""``Engine``: the object callers hold, a :class:`ModelEngine` and the loop that runs it.

The layers, bottom up: operations, forward, caches; the methods and the paged scheduler;
:class:`~engine.model_engine.ModelEngine` (the model and its method table); the
:class:`~engine.loop.EngineLoop` (the one thread that owns all of that state); and this
module, which only joins the two so that ``Engine(settings)`` is the whole engine behind
the ``TextGenerator`` protocol. :meth:`Engine.generate` (any thread) is ``loop.submit`` +
``stream``; every cache is touched on the loop thread only.
"""
from __future__ import annotations

import threading
from typing import Any

from engine.loader import LoadedModel
from engine.loop import EngineLoop
from engine.model_engine import MethodRunner, ModelEngine, UnknownMethodError
from engine.types import CancelCheck, GenerationRequest, GenerationResult, TextCallback
from core.settings import Settings

__all__ = ["Engine", "MethodRunner", "UnknownMethodError"]


class Engine(ModelEngine):
    """A :class:`ModelEngine` with its one :class:`EngineLoop` (created on first use; its
    thread starts on first submit). Its state is touched only by that loop's thread."""

    def __init__(self, settings: Settings, loaded: LoadedModel | None = None) -> None:
        super().__init__(settings, loaded)
        self._loop: EngineLoop | None = None
        self._loop_lock = threading.Lock()

    @property
    def loop(self) -> EngineLoop:
        if self._loop is None:
            with self._loop_lock:
                if self._loop is None:
                    self._loop = EngineLoop(self)
        return self._loop

    def check_owner(self) -> None:
        if self._loop is not None:
            self._loop.check_owner()

    def generate(self, request: GenerationRequest, on_text: TextCallback | None = None,
                 should_cancel: CancelCheck | None = None) -> GenerationResult:
        """Run one request on the loop; callbacks run in the calling thread."""
        return self.loop.generate(request, on_text, should_cancel)

    def close(self) -> None:
        """Stop the loop thread (tests and benchmarks; a worker keeps it for its lifetime)."""
        if self._loop is not None:
            self._loop.close()

    def stats(self) -> dict[str, Any]:
        """For any thread: the loop's last published snapshot (never live engine state)."""
        if self._loop is None:
            return super().stats()
        return {**super().stats(), **self._loop.stats()}
