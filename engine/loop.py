"""``EngineLoop``: the one thread per process that owns the model, the scheduler and every KV cache.

In the style of nano-vllm's ``LLMEngine.step()`` loop and vLLM's engine core. Any thread
*submits* a request and gets a :class:`RequestHandle`; only the loop thread ever touches
engine state (paged pool, block manager, scheduler, contiguous caches, prefix LRU), so no
lock guards it and nothing is built twice.  Each turn of the loop

1. drains its inbox: ``paged`` requests join the scheduler, the other methods queue up;
2. starts at most ONE queued non-batched request (``official``, ``no_cache``,
   ``custom_cache``, ``prefix_cache``) as a solo task (:mod:`engine.solo`), while fewer than
   ``max_batch`` run: one prefill per turn at most, so a burst of arrivals cannot stall;
3. resumes every running solo task, in arrival order, for ONE token each: the methods keep
   their own code (``official`` is transformers' ``generate``) and pause in ``run.accept``;
4. takes ONE batched step of the paged scheduler (every running sequence advances) and hands
   out what the step returned: each streaming sequence's text, then each ended one's result;
5. publishes a stats snapshot (a plain dict swapped in whole) for the heartbeat.

Several requests may be submitted as one *group* (:meth:`EngineLoop.submit_group`: a job's
``n`` choices, a completion's list of prompts). A ``paged`` request whose prompt ids equal an
earlier member's waits until that *leader* has prefilled: its prompt blocks are committed
and hashed by then, so the follower's admission takes them from the block manager (reference
counts, no recompute) and prefills only the part of the prompt past the last full block. The
other methods run each member as its own solo task.

No request holds the loop until it finishes: between two tokens of any request, every other
running request gets one token (or one chunk of prefill) of its own.

Outputs go back through each handle's queue (text pieces, then one result or one error),
so the submitter does all its I/O (Redis events, cancel-flag polls, leases) in its own
thread, never inside a step.  Cancellation and the deadline reach the loop as thread-safe
flags it reads between tokens; a request's deadline counts from when the loop starts it.
The thread runs inside ``torch.inference_mode()`` for its whole life (see :mod:`engine.solo`).
"""
from __future__ import annotations

import itertools
import logging
import queue
import threading
import time
from collections import deque
from concurrent.futures import Future
from typing import Any, Callable

import torch

from core.logs import log_event
from core.methods import BATCHED_METHOD
from core.prefix_hash import salted_root
from engine.batching.arrivals import Arrivals
from engine.batching.scheduler import Scheduler, StepOutput
from engine.constrained import token_constraint
from engine.handwritten import forward_for
from engine.model_engine import ModelEngine
from engine.openmp import release_thread_team
from engine.packed import release_freed_memory
from engine.prompt_logprobs import score_prompt
from engine.run import GenerationRun
from engine.solo import SoloTask
from engine.types import CancelCheck, GenerationRequest, GenerationResult, LogprobsCallback, TextCallback

logger = logging.getLogger("miniserve.engine.loop")
TEXT, LOGPROBS, RESULT, ERROR = "text", "logprobs", "result", "error"
IDLE_WAIT_S = 1.0


class LoopClosedError(RuntimeError):
    """The request was submitted to (or left in) a loop that has been closed."""


class RequestHandle:
    """One submitted request, as its submitter sees it. Every method is thread-safe.

    Consume with :meth:`stream` (text pieces to ``on_text`` in the *calling* thread, then the
    result) or just :meth:`result`; stop it with :meth:`cancel`.
    """

    clock: Callable[[], float] = staticmethod(time.monotonic)  # the deadline's clock (a test steps its own)

    def __init__(self, request_id: int, request: GenerationRequest, timeout_s: float | None) -> None:
        self.id = request_id
        self.request = request
        self.timeout_s = timeout_s
        self.outputs: queue.SimpleQueue[tuple[str, Any]] = queue.SimpleQueue()
        self.future: Future[GenerationResult] = Future()
        self.started = threading.Event()      # set when the loop picks the request up
        self.started_at: float | None = None  # clock() at that moment
        self.timed_out = False                # the loop stopped it at its deadline
        self.tokens_streamed = 0              # generated tokens whose text ``stream`` has handed on
        self.tokens_covered = 0               # of those, leading ones whose text is all out
        self._cancel = threading.Event()
        self._run: GenerationRun | None = None

    # -- submitter side ----------------------------------------------------------------------
    @property
    def waiting(self) -> bool:
        """Submitted but not yet started by the loop (queued behind other work)."""
        return not self.started.is_set()

    def cancel(self) -> None:
        """Ask the loop to stop this request at its next token (its result says ``cancelled``)."""
        self._cancel.set()

    def result(self, timeout: float | None = None) -> GenerationResult:
        """Block until the request ends (discarding streamed text); raises its error."""
        return self.future.result(timeout)

    def stream(self, on_text: TextCallback | None = None, should_cancel: CancelCheck | None = None,
               on_start: Callable[[float], None] | None = None, poll_s: float = 0.05,
               on_logprobs: LogprobsCallback | None = None) -> GenerationResult:
        """Consume this request's outputs in the calling thread; returns the result.

        ``on_text`` gets each piece in order (``tokens_streamed`` then counts the generated
        tokens up to that piece, for a client that plots tokens over time; ``on_logprobs``, when
        the request records them, the entries of the tokens behind the next piece);
        ``should_cancel`` is polled after each piece and
        at least every ``poll_s`` (True cancels); ``on_start(started_at)`` is called once when
        the loop starts the request. A callback that raises cancels the request, then raises.
        """
        notified = False
        try:
            while True:
                try:
                    kind, value = self.outputs.get(timeout=poll_s)
                except queue.Empty:
                    kind, value = None, None
                if not notified and self.started.is_set():
                    notified = True
                    if on_start is not None:
                        on_start(self.started_at or self.clock())
                if kind == TEXT:
                    piece, self.tokens_streamed, self.tokens_covered = value
                    if on_text is not None:
                        on_text(piece)
                elif kind == LOGPROBS and on_logprobs is not None:
                    on_logprobs(value)
                elif kind == RESULT:
                    return value
                elif kind == ERROR:
                    raise value
                if should_cancel is not None and not self._cancel.is_set() and should_cancel():
                    self.cancel()
        except BaseException:
            self.cancel()
            raise

    # -- loop side ---------------------------------------------------------------------------
    def begin(self) -> None:
        self.started_at = self.clock()
        self.started.set()

    def stop_requested(self) -> bool:
        """Read by the loop between tokens: no Redis, no locks."""
        if self._cancel.is_set():
            return True
        if (self.timeout_s is not None and self.started_at is not None
                and self.clock() - self.started_at >= self.timeout_s):
            self.timed_out = True
            return True
        return False

    def bind(self, run: GenerationRun) -> None:
        """The run whose text this handle carries (its token count goes with each piece)."""
        self._run = run

    def push_text(self, piece: str) -> None:
        run = self._run
        counts = (run.shown or (run.generated, run.covered)) if run is not None else (0, 0)
        self.outputs.put((TEXT, (piece, *counts)))

    def covered_ids(self, start: int) -> list[int]:
        """The generated ids from ``start`` up to the last piece handed on whose text is all out
        (``tokens_covered``): what a continuation may skip (worker/resume.py)."""
        return list(self._run.token_ids[start:self.tokens_covered]) if self._run is not None else []

    def push_logprobs(self, entries: list[dict[str, Any]]) -> None:
        self.outputs.put((LOGPROBS, entries))

    def resolve(self, result: GenerationResult | None, error: BaseException | None = None) -> None:
        if self.future.done():
            return
        if error is not None:
            self.outputs.put((ERROR, error))
            self.future.set_exception(error)
        else:
            self.outputs.put((RESULT, result))
            self.future.set_result(result)


class _Job:
    """A request as the loop holds it: its handle, rendered prompt and run."""

    def __init__(self, handle: RequestHandle, prompt: Any, run: GenerationRun, penalty: float,
                 constraint: Any = None) -> None:
        self.handle, self.prompt, self.run, self.penalty = handle, prompt, run, penalty
        self.constraint = constraint  # the sequence's grammar state (engine.constrained), if any
        self.task: SoloTask | None = None  # a non-batched request's greenlet, once started
        self.leader: _Job | None = None  # a group member with the same prompt, prefilled first
        self.seq: Any = None  # a paged request's scheduler sequence, once accepted


class _Call:
    """A function to run on the loop thread (see :meth:`EngineLoop.call`)."""

    def __init__(self, fn: Callable[[], Any], future: Future) -> None:
        self.fn, self.future = fn, future

    def run(self) -> None:
        try:
            self.future.set_result(self.fn())
        except BaseException as exc:  # noqa: BLE001 - handed to the caller
            self.future.set_exception(exc)


class EngineLoop:
    """The owner thread of one :class:`~engine.model_engine.ModelEngine`'s state (see the module doc).

    ``paged`` may be a ready :class:`~engine.batching.scheduler.Scheduler` (benchmarks
    compare pool settings in extra loops over one engine; such a loop must be given one);
    by default (``engine.loop``) the loop builds the engine's one scheduler on its own
    thread, on first use.
    """

    def __init__(self, engine: ModelEngine, paged: Scheduler | None = None) -> None:
        self.engine = engine
        self._paged_jobs: dict[int, _Job] = {}  # the paged scheduler's sequences, by id: whose handle
        self._inbox: queue.SimpleQueue[_Job | _Call | None] = queue.SimpleQueue()
        self._arrivals = Arrivals()             # the inbox's requests by class: a step may yield to one
        self._paged = paged
        if paged is not None:
            paged.arrivals = self._arrivals
        self._solo: deque[_Job] = deque()      # non-batched requests not yet started
        self._running: list[_Job] = []          # started solo tasks, in arrival order
        self._prefill_left = 0                  # prompt tokens the solo tasks may still compute this turn
        self._short_left = 0                    # ...and short prompts beside them (MINISERVE_SHORT_PROMPT_TOKENS)
        self._held: list[_Job] = []             # paged group members waiting for their leader's prefill
        self._ids = itertools.count(1)
        self._thread: threading.Thread | None = None
        self._start_lock = threading.Lock()
        self._closing = threading.Event()
        self.owner: int | None = None          # the loop thread's ident, once started
        self.submitted = 0
        self.snapshot: dict[str, Any] = {"loop": {"solo_waiting": 0}}
        self._was_busy = False
        # A test's gate (worker/step_gate.py): called before a turn's steps, False skips them
        # (the turn still takes its inbox: cancels, new requests). None: no gate.
        self.step_gate: Callable[[], bool] | None = None

    # -- public ------------------------------------------------------------------------------
    def submit(self, request: GenerationRequest, timeout_s: float | None = None,
               should_cancel: CancelCheck | None = None) -> RequestHandle:
        """Queue one request; returns at once. Bad requests (unknown method, prompt errors)
        raise here, in the caller. ``timeout_s`` counts from when the loop starts it;
        ``should_cancel`` is checked once before queuing (an already-cancelled request never
        produces a token); later cancels go through :meth:`RequestHandle.cancel`."""
        handle, job = self._prepare(request, timeout_s, should_cancel)
        if job is not None:
            self._put(job)
        return handle

    def submit_group(self, requests: list[GenerationRequest], timeout_s: float | None = None,
                     should_cancel: CancelCheck | None = None) -> list[RequestHandle]:
        """Queue requests that belong together (see the module doc): a ``paged`` member whose
        prompt repeats an earlier member's is admitted once that one has prefilled. All are
        checked before any is queued, so a bad member queues none."""
        prepared = [self._prepare(request, timeout_s, should_cancel) for request in requests]
        leaders: dict[tuple[int, ...], _Job] = {}
        for _, job in prepared:
            if job is None or job.handle.request.method != BATCHED_METHOD:
                continue
            key = tuple(job.prompt.ids)
            job.leader = leaders.get(key)
            leaders.setdefault(key, job)
        for _, job in prepared:
            if job is not None:
                self._put(job)
        return [handle for handle, _ in prepared]

    def _put(self, job: _Job) -> None:
        self._arrivals.came(job.handle.request.priority)
        self._inbox.put(job)

    def _prepare(self, request: GenerationRequest, timeout_s: float | None,
                 should_cancel: CancelCheck | None) -> tuple[RequestHandle, _Job | None]:
        """The request's handle, and its job for the inbox (None: already resolved)."""
        if self._closing.is_set():
            raise LoopClosedError("the engine loop is closed")
        self.engine.check_method(request.method)
        handle = RequestHandle(next(self._ids), request, timeout_s)
        prompt, run, penalty = self.engine.new_run(request, handle.push_text, handle.stop_requested,
                                                   handle.push_logprobs)
        handle.bind(run)
        constraint = token_constraint(self.engine, request.constraint)  # compiled here: errors raise to the caller
        run.constraint = constraint  # a non-batched method samples with this one (engine.constrained.run_constraint)
        release_thread_team()  # if that ran a parallel op here, its team must not outlive it (engine.openmp)
        self.submitted += 1
        if should_cancel is not None and should_cancel():
            handle.cancel()
        if run.max_new_tokens <= 0:
            handle.begin()
            handle.resolve(run.result(prompt_tokens=len(prompt.ids)))
            return handle, None
        self._ensure_thread()
        return handle, _Job(handle, prompt, run, penalty, constraint)

    def generate(self, request: GenerationRequest, on_text: TextCallback | None = None,
                 should_cancel: CancelCheck | None = None) -> GenerationResult:
        """Blocking submit + stream (the ``TextGenerator`` protocol), from any thread."""
        return self.submit(request, should_cancel=should_cancel).stream(on_text, should_cancel)

    def post(self, fn: Callable[[], Any]) -> "Future[Any]":
        """Queue ``fn()`` to run on the loop thread between steps, in submission order."""
        future: Future[Any] = Future()
        self._ensure_thread()
        self._inbox.put(_Call(fn, future))
        return future

    def call(self, fn: Callable[[], Any], timeout: float | None = None) -> Any:
        """Run ``fn()`` on the loop thread and return its value (tests and benchmarks use it
        to read or reset engine state without racing the loop)."""
        return self.post(fn).result(timeout)

    def gate_steps(self, gate: Callable[[], bool]) -> "Future[Any]":
        """A test's gate on the loop's steps (worker/step_gate.py), installed on the loop's thread."""
        def install() -> None:
            self.step_gate = gate
        return self.post(install)

    def hold_until_queued(self, count: int, limit_s: float = 60.0) -> "Future[Any]":
        """Hold the loop (a test's gate) until ``count`` more items are queued behind the hold,
        or ``limit_s`` passes: requests that arrive while it holds all start in the next turn."""
        def hold() -> None:
            deadline = time.monotonic() + limit_s
            while self._inbox.qsize() < count and time.monotonic() < deadline:
                time.sleep(0.01)
        return self.post(hold)

    @property
    def paged(self) -> Scheduler:
        """The paged scheduler and its cache (built on first use). Loop thread only, or before it starts."""
        self.check_owner()
        if self._paged is None:
            self._paged = Scheduler.for_model(forward_for(self.engine), self.engine.settings)
            self._paged.arrivals = self._arrivals
        return self._paged

    def stats(self) -> dict[str, Any]:
        """The last snapshot the loop published (safe from any thread: it is replaced whole,
        never mutated): the engine's cache counters, ``paged`` scheduler figures, ``loop``."""
        snap = dict(self.snapshot)
        alive = bool(self._thread and self._thread.is_alive())
        snap["loop"] = {**snap.get("loop", {}), "submitted": self.submitted, "alive": alive}
        return snap

    def check_owner(self) -> None:
        """Raise if a thread other than the loop touches engine state while the loop runs."""
        if (self.owner is not None and threading.get_ident() != self.owner
                and self._thread is not None and self._thread.is_alive()):
            raise RuntimeError("engine state touched outside the engine loop thread")

    def close(self, timeout: float = 5.0) -> None:
        """Stop the loop; requests still queued or running end with :class:`LoopClosedError`."""
        self._closing.set()
        self._inbox.put(None)
        if self._thread is not None:
            self._thread.join(timeout)

    # -- the loop ----------------------------------------------------------------------------
    def _ensure_thread(self) -> None:
        with self._start_lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._main, name="miniserve-engine-loop",
                                                daemon=True)
                self._thread.start()

    def _main(self) -> None:
        self.owner = threading.get_ident()
        with torch.inference_mode():  # one mode for the thread's life: solo tasks switch inside it
            while not self._closing.is_set():
                try:
                    self._turn()
                except Exception as exc:  # noqa: BLE001 - the loop must never die silently
                    log_event(logger, "engine_loop_error", level=logging.ERROR, error=type(exc).__name__)
                    time.sleep(0.01)
            self._abandon()

    def _busy(self) -> bool:
        return bool(self._solo or self._running or self._held) or (self._paged is not None and self._paged.has_work)

    def _turn(self) -> None:
        busy = self._busy()
        if not busy:
            release_thread_team()  # idle: leave the CPUs' spinning OpenMP workers to a busy loop
            if self._was_busy:
                release_freed_memory()  # once per idle spell: the requests' freed heap back to the OS
        self._was_busy = busy
        self._drain(block=not busy)
        if self._closing.is_set():
            return
        if self.step_gate is not None and self._busy() and not self.step_gate():
            self._publish()
            return
        if self._solo and len(self._running) < self.engine.settings.max_batch:
            self._start_solo(self._solo.popleft())
        self._advance_solo()
        self._release_held()
        if self._paged is not None and self._paged.has_work:
            self._hand_out(self._paged.step())
        self._publish()

    def _hand_out(self, out: StepOutput) -> None:
        """What the paged step produced goes to its requests: each streaming sequence's text,
        then each ended one's result (or error)."""
        for seq in out.streamed:
            seq.run.hand_out()
        for seq in out.finished:
            self._finish_seq(self._paged_jobs.pop(seq.seq_id), seq)

    def _drain(self, block: bool) -> None:
        try:
            job = self._inbox.get(timeout=IDLE_WAIT_S) if block else self._inbox.get_nowait()
            while True:
                if job is not None:
                    self._accept(job)
                job = self._inbox.get_nowait()
        except queue.Empty:
            return

    def _accept(self, job: _Job | _Call) -> None:
        if isinstance(job, _Call):
            job.run()
            return
        self._arrivals.taken(job.handle.request.priority)
        if not self._score_prompt(job):
            return
        if job.handle.request.method != BATCHED_METHOD:
            self._solo.append(job)
            return
        try:
            scheduler = self.paged
            job.seq = scheduler.new_sequence(job.prompt.ids, job.run, job.handle.request.sampling, job.penalty,
                                             speculative=job.handle.request.speculative,
                                             constraint=job.constraint,
                                             cache_root=salted_root(job.handle.request.cache_salt),
                                             priority=job.handle.request.priority)
        except Exception as exc:  # noqa: BLE001 - e.g. the pool cannot be built: fail this one
            job.handle.resolve(None, exc)
            return
        job.run.defer_output()  # the step returns; _hand_out passes its text on
        self._paged_jobs[job.seq.seq_id] = job
        job.handle.begin()
        if job.leader is not None and not self._leader_ready(job):
            self._held.append(job)
            return
        scheduler.submit(job.seq)

    def _score_prompt(self, job: _Job) -> bool:
        """The prompt's own log-probabilities when asked (module engine.prompt_logprobs);
        False when that failed (the request is resolved with the error)."""
        top = job.handle.request.sampling.prompt_logprobs
        if top is None:
            return True
        try:
            job.run.prompt_logprobs = score_prompt(forward_for(self.engine), job.prompt.ids, top)
        except Exception as exc:  # noqa: BLE001 - this request fails, the loop goes on
            job.handle.resolve(None, exc)
            return False
        return True

    @staticmethod
    def _leader_ready(job: _Job) -> bool:
        """The leader has prefilled (its prompt blocks are committed), ended, or never got a
        sequence; or the follower is cancelled (the scheduler then drops it at once)."""
        leader = job.leader.seq if job.leader is not None else None
        if leader is None or leader.finished or job.run.cancelled():
            return True
        return leader.num_computed >= len(leader.prompt_ids)

    def _release_held(self) -> None:
        if not self._held:
            return
        still = []
        for job in self._held:
            if self._leader_ready(job):
                self.paged.submit(job.seq)
            else:
                still.append(job)
        self._held = still

    def _start_solo(self, job: _Job) -> None:
        job.handle.begin()
        job.task = SoloTask(lambda: self.engine.run_solo(job.prompt, job.run, job.handle.request, job.penalty),
                            job.run)
        job.run.prefill_allowance = self._take_prefill
        self._running.append(job)

    def _take_prefill(self, wanted: int) -> int:
        """Prompt tokens a solo task may compute now: the solo tasks share one step budget
        (``MINISERVE_MAX_BATCHED_TOKENS``) per turn, so however many long prompts arrive,
        a turn spends at most that on them (engine.handwritten.PrefillChunks). Beside paged
        streams the budget is the small one, and a rest of at most
        ``MINISERVE_SHORT_PROMPT_TOKENS`` goes whole from a pool of its own, as in the paged
        scheduler."""
        if 0 < wanted <= self._short_left:
            self._short_left -= wanted
            return wanted
        granted = min(wanted, self._prefill_left)
        self._prefill_left -= granted
        return granted

    def _advance_solo(self) -> None:
        """One token (the first: prefill and one token) for each running solo task; their
        prompts share one step budget per turn (:meth:`_take_prefill`)."""
        settings, streaming = self.engine.settings, self._paged is not None and bool(self._paged.running)
        self._prefill_left = settings.prefill_tokens_while_decoding if streaming else settings.max_batched_tokens
        self._short_left = settings.short_prompt_tokens if streaming else 0
        still: list[_Job] = []
        for job in self._running:
            assert job.task is not None
            if not job.task.resume():
                still.append(job)
            elif job.task.error is not None:
                log_event(logger, "generation_failed", request_id=job.handle.id,
                          method=job.handle.request.method, error=type(job.task.error).__name__)
                job.handle.resolve(None, job.task.error)
            else:
                job.handle.resolve(job.task.result)
        self._running = still

    def _finish_seq(self, job: _Job, seq: Any) -> None:
        if seq.error is not None:
            log_event(logger, "generation_failed", request_id=job.handle.id, method=BATCHED_METHOD,
                      error=type(seq.error).__name__)
            job.handle.resolve(None, seq.error)
            return
        result = seq.run.result(prompt_tokens=len(seq.prompt_ids), cached_tokens=seq.cached_tokens or 0)
        self.engine.log_done(result, preemptions=seq.preemptions)
        job.handle.resolve(result)

    def _publish(self) -> None:
        snap: dict[str, Any] = self.engine.local_stats()
        if self._paged is not None:
            snap[BATCHED_METHOD] = self._paged.snapshot()
        snap["loop"] = {"solo_waiting": len(self._solo), "solo_running": len(self._running)}
        self.snapshot = snap

    def _abandon(self) -> None:
        error = LoopClosedError("the engine loop was closed")
        for job in self._running:
            assert job.task is not None
            job.task.close()
        pending = self._running + list(self._solo) + self._held
        self._running, self._held = [], []
        try:
            while True:
                job = self._inbox.get_nowait()
                if job is not None:
                    pending.append(job)
        except queue.Empty:
            pass
        for job in pending:
            if isinstance(job, _Call):
                job.future.set_exception(error)
            else:
                job.handle.resolve(None, error)
        if self._paged is not None:
            self._hand_out(StepOutput(finished=self._paged.abort_all(error)))
