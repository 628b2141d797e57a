"""What one worker process holds: settings, the job store, the engine, and its heartbeat.

Created lazily per process (and re-created after a fork), so the model is loaded in the
process that serves jobs, never in the Celery parent.
"""
from __future__ import annotations

import logging
import os
import socket
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Iterator

from redis.backoff import ExponentialBackoff
from redis.retry import Retry

from core import keys
from core.jobs import JobStore
from core.logs import configure_logging, log_event
from core.model_source import CHAT, EMBEDDING, model_aliases, model_id, model_kind
from core.redis_conn import redis_client
from core.routing import register_queue
from core.settings import Settings, get_settings
from core import model_text as model_texts
from core.workers import remove_worker, write_heartbeat
from worker.cancel_watch import CancelWatch
from worker.model_text import model_text, pool_tokens
from worker.step_gate import RedisStepGate

logger = logging.getLogger("miniserve.worker")
HEARTBEAT_S = 5.0
RETRY_RAMP = 5  # retries before the backoff reaches its 1 s cap


class ModelUnavailable(RuntimeError):
    """This worker's model failed to load: a job it takes fails with code ``model_unavailable``
    and the load error's message (which names the model and why), not an internal error."""


@dataclass
class WorkerRuntime:
    settings: Settings
    store: JobStore
    name: str
    node: str = ""  # the Celery node name (name@host); its own queue is keys.worker_queue(node)
    pool: str = "prefork"
    concurrency: int = 1
    current_jobs: set[str] = field(default_factory=set)
    token_events: int = 0  # token events streamed since start (the monitor's tokens/s chart)
    _engine: Any = None
    load_error: str | None = None  # why the model could not be loaded (a ModelLoadError): on /workers, in job errors
    _engine_lock: threading.Lock = field(default_factory=threading.Lock)
    _cancels: CancelWatch | None = None
    _text_published: bool = False
    _cancels_lock: threading.Lock = field(default_factory=threading.Lock)
    _pid: int = field(default_factory=os.getpid)
    _beat_lock: threading.Lock = field(default_factory=threading.Lock)
    _left: bool = False

    @property
    def engine(self):
        """The process's engine, loaded on first use (imports torch only here). Its loop thread
        owns every cache; job threads reach it only through ``engine.loop.submit``. An
        embedding model's worker holds an ``EmbeddingService`` instead (its batcher's thread
        owns the model; job threads reach it through ``submit``)."""
        if self._engine is None:
            with self._engine_lock:
                if self.load_error is not None:   # a start error stays one: no reload per job
                    raise ModelUnavailable(self.load_error)
                if self._engine is None:
                    from engine.errors import ModelLoadError

                    started = time.perf_counter()
                    engine = _new_engine(self.settings, self.model_kind)
                    try:
                        engine.load()
                    except ModelLoadError as exc:
                        self.load_error = str(exc)
                        log_event(logger, "model_load_failed", level=logging.ERROR, worker=self.name,
                                  error=type(exc).__name__)
                        self.beat()  # the monitor shows the error now, not at the next beat
                        raise ModelUnavailable(self.load_error) from exc
                    log_event(logger, "engine_loaded", worker=self.name,
                              load_ms=round((time.perf_counter() - started) * 1000, 1))
                    # the gate's install first: the hold counts what is queued behind it
                    if self.settings.test_step_gate and self.model_kind != EMBEDDING:
                        engine.loop.gate_steps(RedisStepGate.from_settings(self.settings))
                    if self.settings.test_loop_hold and self.model_kind != EMBEDDING:
                        engine.loop.hold_until_queued(self.settings.test_loop_hold, self.settings.test_loop_hold_s)
                    self._engine = engine
                    self.beat()  # loaded and routable now, not up to a heartbeat later (publishes the text too)
        return self._engine

    @property
    def cancels(self) -> CancelWatch:
        """The process's one cancel subscription (started with its first job)."""
        if self._cancels is None:
            with self._cancels_lock:
                if self._cancels is None:
                    self._cancels = CancelWatch(self.store.client)
        return self._cancels

    @property
    def model_id(self) -> str:
        """The public id of the model this worker serves (core/models.py)."""
        return model_id(self.settings.model)

    @property
    def model_kind(self) -> str:
        """``chat`` or ``embedding`` (core.model_source.model_kind): which engine and queues."""
        return model_kind(self.settings.model)

    @property
    def batching(self) -> bool:
        """Several jobs run at once in this process (threads pool): they share paged batches."""
        return self.pool != "prefork" and self.concurrency > 1

    @contextmanager
    def tracking(self, job_id: str) -> Iterator[None]:
        self.current_jobs.add(job_id)
        try:
            yield
        finally:
            self.current_jobs.discard(job_id)

    def describe(self) -> dict[str, Any]:
        info: dict[str, Any] = {
            "host": socket.gethostname(), "node": self.node, "queue": keys.worker_queue(self.node),
            "pid": os.getpid(), "pool": self.pool, "concurrency": self.concurrency,
            "current_jobs": sorted(self.current_jobs), "model": self.settings.model,
            "model_id": self.model_id, "model_aliases": model_aliases(self.settings), "model_kind": self.model_kind,
            "token_events": self.token_events,
            "engine_loaded": self._engine is not None,
        }
        if self.load_error is not None:
            info["load_error"] = self.load_error
        if self._engine is not None:
            info.update(self._engine.info())
            info["cache_stats"] = self._engine.stats()   # the loop's published snapshot
        return info

    def start_heartbeat(self) -> None:
        thread = threading.Thread(target=self._heartbeat_loop, name="miniserve-heartbeat", daemon=True)
        thread.start()

    def _heartbeat_loop(self) -> None:
        while not self._left:
            self.beat()
            time.sleep(HEARTBEAT_S)

    def beat(self) -> None:
        """One heartbeat; any failure is logged and the next beat tries again. None after
        :meth:`leave`."""
        with self._beat_lock:
            if self._left:
                return
            try:
                write_heartbeat(self.store.client, self.name, self.describe(), ttl_s=int(HEARTBEAT_S * 3))
                if self._text_published:
                    model_texts.refresh(self.store.client, self.model_id)
                else:
                    self.publish_text()
            except Exception as exc:  # noqa: BLE001 - the heartbeat thread must never die
                log_event(logger, "heartbeat_failed", level=logging.WARNING, error=type(exc).__name__)

    def leave(self) -> None:
        """Forget this worker at once (a graceful stop) and beat no more. Why the lock: a beat
        under way when the stop came used to write its heartbeat after the removal, leaving a
        stopped worker listed until the heartbeat's TTL ran out."""
        with self._beat_lock:
            self._left = True
            remove_worker(self.store.client, self.name)

    def publish_text(self) -> None:
        """Once the model has loaded, its tokenizer, template and limits for the web
        (core/model_text.py); a failure is logged and the next heartbeat tries again."""
        if self._engine is None or self._text_published or self.model_kind != CHAT:
            return
        try:
            text = model_text(self._engine.loaded, pool_tokens(self.settings, self._engine.loaded))
            written = text is not None and model_texts.publish(self.store.client, self.model_id, text)
            self._text_published = True
            log_event(logger, "model_text_published", worker=self.name, written=written,
                      tokenizer_bytes=len(text.tokenizer_json) if text else 0)
        except Exception as exc:  # noqa: BLE001 - the web falls back to its own files meanwhile
            log_event(logger, "model_text_publish_failed", level=logging.WARNING, error=type(exc).__name__)


def _new_engine(settings: Settings, kind: str):
    """The engine of this worker's kind of model, not loaded yet."""
    if kind == EMBEDDING:
        from engine.embedding.service import EmbeddingService
        return EmbeddingService(settings)
    from engine.engine import Engine
    return Engine(settings)


def make_store(settings: Settings) -> JobStore:
    """A JobStore whose client rides out a Redis restart: a lost connection is retried for
    about ``MINISERVE_WORKER_REDIS_RETRY_S`` (60 s; backoff 0.05 s doubling to 1 s), so a
    running job keeps its attempt through an outage instead of failing and waiting for its
    lease to expire."""
    client = redis_client(settings, decode_responses=True,
                                  health_check_interval=30, socket_keepalive=True, socket_connect_timeout=2,
                                  retry=Retry(ExponentialBackoff(cap=1.0, base=0.05),
                                              settings.worker_redis_retry_s + RETRY_RAMP))
    return JobStore(client, ttl_s=settings.job_ttl_s)


_runtime: WorkerRuntime | None = None
_runtime_lock = threading.Lock()


def configure(pool: str, concurrency: int, hostname: str | None = None) -> None:
    """Called from Celery signals with what the worker was started with."""
    global _pool_info
    _pool_info = (pool, concurrency, hostname or socket.gethostname())


_pool_info: tuple[str, int, str] = ("prefork", 1, socket.gethostname())


def runtime() -> WorkerRuntime:
    """The current process's runtime, created on first use in this process."""
    global _runtime
    if _runtime is None or _runtime._pid != os.getpid():
        with _runtime_lock:
            if _runtime is None or _runtime._pid != os.getpid():
                settings = get_settings()
                configure_logging(settings.log_level, settings.json_logs)
                pool, concurrency, hostname = _pool_info
                _runtime = WorkerRuntime(settings=settings, store=make_store(settings), node=hostname,
                                         name=f"{hostname}:{os.getpid()}", pool=pool, concurrency=concurrency)
                if _runtime.model_kind == CHAT:  # an embedding worker has no routing queue (worker/app.py)
                    register_queue(_runtime.store.client, keys.worker_queue(hostname), _runtime.name,
                                   home=keys.model_queue("generation", _runtime.model_id))
                _runtime.start_heartbeat()
    return _runtime
