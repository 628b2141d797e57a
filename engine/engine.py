"""``Engine``: one loaded model and its generation methods, behind the ``TextGenerator`` protocol.

Built cheaply (``Engine(settings)``); the model loads on first use, in whichever process
first calls it (a Celery child, never the parent before fork). Every method shares prompt
rendering (:mod:`engine.prompt`) and per-request bookkeeping (:mod:`engine.run`).
"""
from __future__ import annotations

import logging
import threading
import time
from typing import Any, Callable

from core.logs import log_event
from core.settings import GENERATION_METHODS, Settings
from engine.loader import LoadedModel, load_model
from engine.prompt import Prompt, build_prompt
from engine.run import GenerationRun
from engine.types import CancelCheck, GenerationRequest, GenerationResult, TextCallback

logger = logging.getLogger("miniserve.engine")

# A method runner fills ``run`` with tokens and returns how many prompt tokens came from a cache.
MethodRunner = Callable[["Engine", Prompt, GenerationRun, GenerationRequest, float], int]


class UnknownMethodError(ValueError):
    """The request names a generation method this engine does not provide."""


class Engine:
    """Owns the model, its caches and the method table. Not thread-safe for generation:
    a worker process runs one request at a time through one engine."""

    def __init__(self, settings: Settings, loaded: LoadedModel | None = None) -> None:
        self.settings = settings
        self._loaded = loaded
        self._load_lock = threading.Lock()
        self._methods: dict[str, MethodRunner] = {}
        self._state: dict[str, Any] = {}  # per-method lazily built objects (caches, forward)
        self.requests = 0
        self._register_builtin_methods()

    # -- loading -------------------------------------------------------------------------
    @property
    def loaded(self) -> LoadedModel:
        if self._loaded is None:
            with self._load_lock:
                if self._loaded is None:
                    self._loaded = load_model(self.settings)
        return self._loaded

    def load(self) -> "Engine":
        """Load the model now (idempotent); the worker calls this once per process."""
        _ = self.loaded
        return self

    @property
    def is_loaded(self) -> bool:
        return self._loaded is not None

    def state(self, key: str, factory: Callable[[], Any]) -> Any:
        """A per-engine object built on first use (e.g. the prefix cache)."""
        if key not in self._state:
            self._state[key] = factory()
        return self._state[key]

    # -- methods -------------------------------------------------------------------------
    def register_method(self, name: str, runner: MethodRunner) -> None:
        self._methods[name] = runner

    def _register_builtin_methods(self) -> None:
        from engine.methods import builtin_methods

        for name, runner in builtin_methods().items():
            self.register_method(name, runner)

    @property
    def methods(self) -> list[str]:
        return [m for m in GENERATION_METHODS if m in self._methods] + sorted(
            m for m in self._methods if m not in GENERATION_METHODS)

    # -- the protocol ----------------------------------------------------------------------
    def prompt(self, request: GenerationRequest) -> Prompt:
        return build_prompt(self.loaded.tokenizer, request)

    def count_prompt_tokens(self, request: GenerationRequest) -> int:
        return len(self.prompt(request).ids)

    def generate(self, request: GenerationRequest, on_text: TextCallback | None = None,
                 should_cancel: CancelCheck | None = None) -> GenerationResult:
        runner = self._methods.get(request.method)
        if runner is None:
            raise UnknownMethodError(f"unknown generation_method {request.method!r}; "
                                     f"available: {', '.join(self.methods)}")
        started = time.perf_counter()
        loaded = self.loaded
        prompt = self.prompt(request)
        sampling = request.sampling
        penalty = sampling.repetition_penalty
        if penalty is None:
            penalty = loaded.default_repetition_penalty
        run = GenerationRun(loaded.tokenizer, method=request.method,
                            max_new_tokens=sampling.max_new_tokens, eos_ids=loaded.eos_ids,
                            stops=sampling.stop, on_text=on_text, should_cancel=should_cancel,
                            started=started)
        cached = runner(self, prompt, run, request, penalty) if sampling.max_new_tokens > 0 else 0
        result = run.result(prompt_tokens=len(prompt.ids), cached_tokens=cached)
        self.requests += 1
        log_event(logger, "generation_done", method=request.method, finish_reason=result.finish_reason,
                  prompt_tokens=result.usage.prompt_tokens, cached_tokens=cached,
                  completion_tokens=result.usage.completion_tokens,
                  ttft_ms=round(result.timings.ttft_s * 1000, 1),
                  latency_ms=round(result.timings.total_s * 1000, 1))
        return result

    # -- introspection ---------------------------------------------------------------------
    def info(self) -> dict[str, Any]:
        loaded = self.loaded
        return {"model": loaded.name, "path": loaded.path, "device": str(loaded.device),
                "dtype": str(loaded.dtype).replace("torch.", ""), "quant": loaded.quant,
                "load_s": round(loaded.load_s, 3), "methods": self.methods}

    def stats(self) -> dict[str, Any]:
        """Counters per cache (empty until a method that uses one has run)."""
        out: dict[str, Any] = {"requests": self.requests, "model_loaded": self.is_loaded}
        for key, obj in self._state.items():
            if hasattr(obj, "stats"):
                out[key] = obj.stats()
        return out
