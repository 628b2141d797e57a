"""``Engine``: one loaded model and its generation methods, behind the ``TextGenerator`` protocol.

Built cheaply (``Engine(settings)``); the model loads on first use, in whichever process
first calls it (a Celery child, never the parent before fork). Every method shares prompt
rendering (:mod:`engine.prompt`) and per-request bookkeeping (:mod:`engine.run`).

Generation runs on the engine's one :class:`~engine.loop.EngineLoop` thread, which owns every
cache: :meth:`Engine.generate` (any thread) is ``loop.submit`` + ``stream``. ``paged`` is the
loop's batched path; the other methods are in the method table and run one at a time on it.
"""
from __future__ import annotations

import logging
import threading
import time
from typing import Any, Callable

from core.logs import log_event
from core.settings import GENERATION_METHODS, Settings
from engine.openmp import release_thread_team
from engine.loader import LoadedModel, load_model
from engine.prompt import Prompt, build_prompt
from engine.run import GenerationRun
from engine.types import CancelCheck, GenerationRequest, GenerationResult, TextCallback

logger = logging.getLogger("miniserve.engine")
BATCHED_METHOD = "paged"

# A method runner fills ``run`` with tokens and returns how many prompt tokens came from a cache.
MethodRunner = Callable[["Engine", Prompt, GenerationRun, GenerationRequest, float], int]


class UnknownMethodError(ValueError):
    """The request names a generation method this engine does not provide."""


class Engine:
    """Owns the model, its caches and the method table. Its state is touched only by its loop
    thread (:attr:`loop`); :meth:`generate` and :attr:`loop`'s ``submit`` work from any thread."""

    def __init__(self, settings: Settings, loaded: LoadedModel | None = None) -> None:
        self.settings = settings
        self._loaded = loaded
        self._load_lock = threading.Lock()
        self._methods: dict[str, MethodRunner] = {}
        self._state: dict[str, Any] = {}  # per-method lazily built objects (caches, forward)
        self.requests = 0
        self._loop: Any = None
        self._loop_lock = threading.Lock()
        self._register_builtin_methods()

    # -- loading -------------------------------------------------------------------------
    @property
    def loaded(self) -> LoadedModel:
        if self._loaded is None:
            with self._load_lock:
                if self._loaded is None:
                    self._loaded = load_model(self.settings)
                    release_thread_team()  # the loading thread's OpenMP team would slow the loop's
        return self._loaded

    def load(self) -> "Engine":
        """Load the model now (idempotent); the worker calls this once per process."""
        _ = self.loaded
        return self

    @property
    def is_loaded(self) -> bool:
        return self._loaded is not None

    @property
    def loop(self) -> Any:
        """The engine's one loop (created on first use; its thread starts on first submit)."""
        if self._loop is None:
            with self._loop_lock:
                if self._loop is None:
                    from engine.loop import EngineLoop

                    self._loop = EngineLoop(self)
        return self._loop

    def close(self) -> None:
        """Stop the loop thread (tests and benchmarks; a worker keeps it for its lifetime)."""
        if self._loop is not None:
            self._loop.close()

    def state(self, key: str, factory: Callable[[], Any]) -> Any:
        """A per-engine object built on first use (e.g. the prefix cache), on the loop thread."""
        if self._loop is not None:
            self._loop.check_owner()
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
        names = {*self._methods, BATCHED_METHOD}
        return [m for m in GENERATION_METHODS if m in names] + sorted(
            m for m in names if m not in GENERATION_METHODS)

    def check_method(self, method: str) -> None:
        if method != BATCHED_METHOD and method not in self._methods:
            raise UnknownMethodError(f"unknown generation_method {method!r}; "
                                     f"available: {', '.join(self.methods)}")

    # -- the protocol ----------------------------------------------------------------------
    def prompt(self, request: GenerationRequest) -> Prompt:
        return build_prompt(self.loaded.tokenizer, request)

    def count_prompt_tokens(self, request: GenerationRequest) -> int:
        return len(self.prompt(request).ids)

    def generate(self, request: GenerationRequest, on_text: TextCallback | None = None,
                 should_cancel: CancelCheck | None = None) -> GenerationResult:
        """Run one request on the loop; callbacks run in the calling thread."""
        return self.loop.generate(request, on_text, should_cancel)

    def new_run(self, request: GenerationRequest, on_text: TextCallback,
                should_cancel: CancelCheck) -> tuple[Prompt, GenerationRun, float]:
        """Render the prompt and build the request's run (in the submitting thread)."""
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
        return prompt, run, penalty

    def run_solo(self, prompt: Prompt, run: GenerationRun, request: GenerationRequest,
                 penalty: float) -> GenerationResult:
        """Run a non-batched method to completion (on the loop thread)."""
        if self._loop is not None:
            self._loop.check_owner()
        cached = self._methods[request.method](self, prompt, run, request, penalty)
        result = run.result(prompt_tokens=len(prompt.ids), cached_tokens=cached)
        self.log_done(result)
        return result

    def log_done(self, result: GenerationResult, **extra: Any) -> None:
        self.requests += 1
        log_event(logger, "generation_done", method=result.method, finish_reason=result.finish_reason,
                  prompt_tokens=result.usage.prompt_tokens, cached_tokens=result.usage.cached_tokens,
                  completion_tokens=result.usage.completion_tokens,
                  ttft_ms=round(result.timings.ttft_s * 1000, 1),
                  latency_ms=round(result.timings.total_s * 1000, 1), **extra)

    # -- introspection ---------------------------------------------------------------------
    def info(self) -> dict[str, Any]:
        loaded = self.loaded
        return {"model": loaded.name, "path": loaded.path, "device": str(loaded.device),
                "dtype": str(loaded.dtype).replace("torch.", ""), "quant": loaded.quant,
                "load_s": round(loaded.load_s, 3), "methods": self.methods}

    def local_stats(self) -> dict[str, Any]:
        """Counters per cache; read on the loop thread, which publishes them in its snapshot."""
        out: dict[str, Any] = {"requests": self.requests, "model_loaded": self.is_loaded}
        for key, obj in list(self._state.items()):
            if hasattr(obj, "stats"):
                out[key] = obj.stats()
        return out

    def stats(self) -> dict[str, Any]:
        """For any thread: the loop's last published snapshot (never live engine state)."""
        if self._loop is None:
            return {"requests": self.requests, "model_loaded": self.is_loaded}
        return {"requests": self.requests, "model_loaded": self.is_loaded, **self._loop.stats()}
