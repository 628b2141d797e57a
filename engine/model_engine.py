"""``ModelEngine``: one loaded model and its table of generation methods.

Built cheaply; the model loads on first use, in whichever process first calls it (a Celery
child, never the parent before fork). Every method shares prompt rendering
(:mod:`engine.prompt`) and per-request bookkeeping (:mod:`engine.run`).

It knows no thread: the :class:`~engine.loop.EngineLoop` above it runs its methods (``paged``
is the loop's batched path; the others are in the method table and run as solo tasks), and
:class:`~engine.engine.Engine` on top puts the two together for callers.
"""
from __future__ import annotations

import logging
import threading
import time
from typing import Any, Callable

from core.logs import log_event
from core.methods import BATCHED_METHOD, GENERATION_METHODS
from core.settings import Settings
from engine.loader import LoadedModel, load_model
from engine.methods import builtin_methods
from engine.openmp import release_thread_team
from engine.prompt import Prompt, build_prompt
from engine.run import GenerationRun
from engine.types import CancelCheck, GenerationRequest, GenerationResult, LogprobsCallback, TextCallback

logger = logging.getLogger("miniserve.engine")

# A method runner fills ``run`` with tokens and returns how many prompt tokens came from a cache.
MethodRunner = Callable[["ModelEngine", Prompt, GenerationRun, GenerationRequest, float], int]


class UnknownMethodError(ValueError):
    """The request names a generation method this engine does not provide."""


class ModelEngine:
    """Owns the model, its caches and the method table. Its state is touched only by the one
    loop thread that runs it (:meth:`check_owner` is where a subclass enforces that)."""

    def __init__(self, settings: Settings, loaded: LoadedModel | None = None) -> None:
        self.settings = settings
        self._loaded = loaded
        self._load_lock = threading.Lock()
        self._methods: dict[str, MethodRunner] = {}
        self._state: dict[str, Any] = {}  # per-method lazily built objects (caches, forward)
        self.requests = 0
        for name, runner in builtin_methods().items():
            self.register_method(name, runner)

    # -- loading -------------------------------------------------------------------------
    @property
    def loaded(self) -> LoadedModel:
        if self._loaded is None:
            with self._load_lock:
                if self._loaded is None:
                    self._loaded = load_model(self.settings)
                    release_thread_team()  # the loading thread's OpenMP team would slow the loop's
        return self._loaded

    def load(self) -> "ModelEngine":
        """Load the model now (idempotent); the worker calls this once per process."""
        _ = self.loaded
        return self

    @property
    def is_loaded(self) -> bool:
        return self._loaded is not None

    def check_owner(self) -> None:
        """Raise if the calling thread may not touch engine state; here, any thread may."""

    def state(self, key: str, factory: Callable[[], Any]) -> Any:
        """A per-engine object built on first use (e.g. the prefix cache), on the loop thread."""
        self.check_owner()
        if key not in self._state:
            self._state[key] = factory()
        return self._state[key]

    # -- methods -------------------------------------------------------------------------
    def register_method(self, name: str, runner: MethodRunner) -> None:
        self._methods[name] = runner

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

    def new_run(self, request: GenerationRequest, on_text: TextCallback, should_cancel: CancelCheck,
                on_logprobs: LogprobsCallback | None = None) -> tuple[Prompt, GenerationRun, float]:
        """Render the prompt and build the request's run (in the submitting thread)."""
        started = time.perf_counter()
        loaded = self.loaded
        prompt = self.prompt(request)
        if request.resume is not None:  # an earlier attempt's answer so far is prefilled with the prompt
            prompt = Prompt(ids=prompt.ids + list(request.resume.ids), prefix_len=prompt.prefix_len)
        sampling = request.sampling
        penalty = sampling.repetition_penalty
        if penalty is None:
            penalty = loaded.default_repetition_penalty
        run = GenerationRun(loaded.tokenizer, method=request.method,
                            max_new_tokens=sampling.max_new_tokens, eos_ids=loaded.eos_ids,
                            stops=sampling.stop, min_tokens=sampling.min_tokens, on_text=on_text,
                            should_cancel=should_cancel,
                            started=started, logprobs=sampling.logprobs, on_logprobs=on_logprobs)
        if request.resume is not None:
            run.resume(request.resume)
        return prompt, run, penalty

    def run_solo(self, prompt: Prompt, run: GenerationRun, request: GenerationRequest,
                 penalty: float) -> GenerationResult:
        """Run a non-batched method to its end (on the loop thread, as a solo task)."""
        self.check_owner()
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
        return {"model": loaded.name, "architecture": loaded.spec.describe() if loaded.spec else None,
                "path": loaded.path, "device": str(loaded.device),
                "dtype": str(loaded.dtype).replace("torch.", ""), "quant": loaded.quant,
                "load_s": round(loaded.load_s, 3), "methods": self.methods}

    def local_stats(self) -> dict[str, Any]:
        """Counters per cache; read on the loop thread, which publishes them in its snapshot."""
        out = self._basics()
        for key, obj in list(self._state.items()):
            if hasattr(obj, "stats"):
                out[key] = obj.stats()
        return out

    def stats(self) -> dict[str, Any]:
        """For any thread: no live cache state (:class:`~engine.engine.Engine` adds its loop's snapshot)."""
        return self._basics()

    def _basics(self) -> dict[str, Any]:
        return {"requests": self.requests, "model_loaded": self.is_loaded}
