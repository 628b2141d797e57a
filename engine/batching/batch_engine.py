"""``BatchEngine``: submit requests from any thread, one engine loop serves them all at once.

The worker process keeps one :class:`BatchEngine` next to its :class:`engine.engine.Engine`.
Each Celery job thread calls :meth:`BatchEngine.submit` (or the blocking
:meth:`BatchEngine.generate`, which satisfies the ``TextGenerator`` protocol, so the agent
can use it too); a single daemon thread steps the paged scheduler while there is work, so
every job in flight shares each forward.  ``on_text`` and ``should_cancel`` are called on
the loop thread (between steps), and must be cheap and thread-safe (a Redis XADD / GET is).
The returned future resolves to the job's :class:`GenerationResult` (method ``paged``) or
raises its error; cancelling the future cancels the sequence.
"""
from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import Future
from typing import Any

from core.logs import log_event
from engine.batching.sequence import Sequence
from engine.batching.service import PagedService, paged_service
from engine.run import GenerationRun
from engine.types import CancelCheck, GenerationRequest, GenerationResult, TextCallback

logger = logging.getLogger("miniserve.engine.batch")
METHOD = "paged"


class BatchEngine:
    def __init__(self, engine: Any, service: PagedService | None = None):
        self.engine = engine
        self._service = service
        self._thread: threading.Thread | None = None
        self._closing = threading.Event()
        self._start_lock = threading.Lock()
        self.submitted = 0

    @property
    def service(self) -> PagedService:
        if self._service is None:
            self._service = paged_service(self.engine)
        return self._service

    # ------------------------------------------------------------------ public
    def submit(self, request: GenerationRequest, on_text: TextCallback | None = None,
               should_cancel: CancelCheck | None = None) -> "Future[GenerationResult]":
        """Queue one request; returns at once. Prompt errors raise here, in the caller."""
        if self._closing.is_set():
            raise RuntimeError("BatchEngine is closed")
        started = time.perf_counter()
        loaded = self.engine.loaded
        prompt = self.engine.prompt(request)
        sampling = request.sampling
        penalty = sampling.repetition_penalty
        if penalty is None:
            penalty = loaded.default_repetition_penalty
        future: Future[GenerationResult] = Future()

        def cancelled() -> bool:
            return future.cancelled() or bool(should_cancel and should_cancel())

        run = GenerationRun(loaded.tokenizer, method=METHOD, max_new_tokens=sampling.max_new_tokens,
                            eos_ids=loaded.eos_ids, stops=sampling.stop, on_text=on_text,
                            should_cancel=cancelled, started=started)
        self.submitted += 1
        if sampling.max_new_tokens <= 0:
            future.set_result(run.result(prompt_tokens=len(prompt.ids)))
            return future
        seq = self.service.new_sequence(prompt.ids, run, sampling, penalty,
                                        on_finish=lambda s: self._resolve(s, future))
        self.service.add(seq)
        self._ensure_loop()
        return future

    def generate(self, request: GenerationRequest, on_text: TextCallback | None = None,
                 should_cancel: CancelCheck | None = None) -> GenerationResult:
        """Blocking form of :meth:`submit` (the ``TextGenerator`` protocol)."""
        return self.submit(request, on_text, should_cancel).result()

    def stats(self) -> dict[str, Any]:
        """Monitor figures: running/waiting sequences, batch size, blocks in use."""
        if self._service is None:
            return {"running": 0, "waiting": 0, "batch_size": 0, "submitted": self.submitted}
        return {**self.service.stats(), "submitted": self.submitted,
                "loop_alive": bool(self._thread and self._thread.is_alive())}

    def close(self, timeout: float = 5.0) -> None:
        """Stop the loop thread (sequences still queued are left unfinished)."""
        self._closing.set()
        if self._service is not None:
            self.service.wakeup.set()
        if self._thread is not None:
            self._thread.join(timeout)

    # ------------------------------------------------------------------ internals
    def _resolve(self, seq: Sequence, future: Future) -> None:
        if future.done():
            return
        if seq.error is not None:
            future.set_exception(seq.error)
            log_event(logger, "generation_failed", seq_id=seq.seq_id, error=type(seq.error).__name__)
            return
        try:
            result = seq.run.result(prompt_tokens=len(seq.prompt_ids),
                                    cached_tokens=seq.cached_tokens or 0)
        except Exception as exc:  # noqa: BLE001 - the final on_text may fail
            future.set_exception(exc)
            return
        future.set_result(result)
        log_event(logger, "generation_done", method=METHOD, seq_id=seq.seq_id,
                  finish_reason=result.finish_reason, prompt_tokens=result.usage.prompt_tokens,
                  cached_tokens=result.usage.cached_tokens,
                  completion_tokens=result.usage.completion_tokens, preemptions=seq.preemptions,
                  ttft_ms=round(result.timings.ttft_s * 1000, 1),
                  latency_ms=round(result.timings.total_s * 1000, 1))

    def _ensure_loop(self) -> None:
        with self._start_lock:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._loop, name="miniserve-batch-loop",
                                                daemon=True)
                self._thread.start()

    def _loop(self) -> None:
        service = self.service
        while not self._closing.is_set():
            if not service.scheduler.has_work:
                service.wakeup.wait(timeout=1.0)
                service.wakeup.clear()
                continue
            try:
                service.step()
            except Exception as exc:  # noqa: BLE001 - never let the loop die silently
                log_event(logger, "batch_loop_error", error=type(exc).__name__)
                time.sleep(0.01)
