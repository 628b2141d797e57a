"""Job threads and the engine loop (fakeredis job store, tiny model): the time limit counts
from when the loop starts a request, waits are reported, and the heartbeat never dies."""
from __future__ import annotations

import threading
import time
from types import SimpleNamespace

import fakeredis
import pytest

from core.events import TOKEN, WAITING
from core.jobs import JobStore
from core.settings import load_settings
from core.workers import list_workers
from engine.loop import RequestHandle
from engine.types import GenerationRequest, SamplingParams
from tests.tiny_model import tiny_model_dir  # noqa: F401  (fixture)
from worker.job_runner import JobContext
from worker.runtime import WorkerRuntime
from worker.tasks import WorkerGenerator


@pytest.fixture(scope="module")
def engine(tiny_model_dir):  # noqa: F811
    from engine.engine import Engine

    eng = Engine(load_settings(model=str(tiny_model_dir), dtype="float32", device="cpu"))
    yield eng
    eng.close()


@pytest.fixture
def store():
    return JobStore(fakeredis.FakeRedis(decode_responses=True), ttl_s=60)


def _context(store, limit_s, clock=time.monotonic):
    job = store.create("generate", "generation", {})
    started = store.start_attempt(job.id, "w1", lease_s=30)
    return JobContext(store, store.get(job.id), started.attempt, deadline=clock() + limit_s, clock=clock)


class SteppedClock:
    """The job's and the engine loop's clock, moved only by the test."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _req(method="custom_cache", tokens=6):
    return GenerationRequest(messages=[{"role": "user", "content": "hello"}], method=method,
                             sampling=SamplingParams(max_new_tokens=tokens))


def _events(store, job_id):
    return [(e.type, e.data) for e in store.events(job_id)]


def test_waiting_for_the_loop_does_not_start_the_time_limit(engine, store, monkeypatch):
    engine.generate(_req())                           # warm: model loaded, forward built
    clock = SteppedClock()
    monkeypatch.setattr(RequestHandle, "clock", staticmethod(clock))
    ctx = _context(store, limit_s=2.0, clock=clock)
    gate = threading.Event()
    engine.loop.post(gate.wait)                       # another request holds the loop
    emit = ctx.emit

    def emit_then_release(kind, data):
        emit(kind, data)
        if kind == WAITING and data["waiting"]:       # told the client it waits: 100 s pass, then the loop frees
            clock.now += 100.0
            gate.set()

    monkeypatch.setattr(ctx, "emit", emit_then_release)
    generator = WorkerGenerator(SimpleNamespace(engine=engine), ctx)
    result = generator.generate(_req(), on_text=ctx.on_text, should_cancel=ctx.should_cancel)
    ctx.flush_text()                                  # as run_job does before the terminal event
    assert ctx.stopped_reason is None and result.finish_reason in ("length", "stop")
    events = _events(store, ctx.job_id)
    waits = [data["waiting"] for kind, data in events if kind == WAITING]
    assert waits == [True, False]
    assert "".join(data["text"] for kind, data in events if kind == TOKEN) == result.text
    assert ctx.time_left() == pytest.approx(2.0)      # the 100 s wait was not charged


def test_the_time_limit_still_ends_a_running_request(engine, store):
    ctx = _context(store, limit_s=0.0)
    generator = WorkerGenerator(SimpleNamespace(engine=engine), ctx)
    result = generator.generate(_req(tokens=200), on_text=ctx.on_text, should_cancel=ctx.should_cancel)
    assert ctx.stopped_reason == "timeout" and result.finish_reason == "cancelled"


def test_heartbeat_survives_a_failing_stats_call(store):
    class FlakyEngine:
        broken = True

        def info(self):
            return {"model": "tiny"}

        def stats(self):
            if self.broken:
                raise RuntimeError("stats raced a new state")
            return {"requests": 1}

    rt = WorkerRuntime(settings=load_settings(), store=store, name="w-test")
    rt._engine = FlakyEngine()
    rt.beat()                                            # logged, not raised
    assert list_workers(store.client, max_age_s=60) == []
    rt._engine.broken = False
    rt.beat()
    (worker,) = list_workers(store.client, max_age_s=60)
    assert worker["info"]["cache_stats"] == {"requests": 1}


def test_a_model_that_cannot_load_is_on_the_heartbeat_and_fails_jobs_clearly(store, tmp_path):
    from transformers import AutoConfig

    from worker.job_runner import _outcome
    from worker.runtime import ModelUnavailable

    AutoConfig.for_model("phi3", hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                         num_attention_heads=4, vocab_size=100).save_pretrained(tmp_path)
    rt = WorkerRuntime(settings=load_settings(model=str(tmp_path), device="cpu"), store=store, name="w-bad")
    with pytest.raises(ModelUnavailable, match="model_type 'phi3'"):
        rt.engine
    rt.beat()
    (worker,) = list_workers(store.client, max_age_s=60)
    assert "phi3" in worker["info"]["load_error"] and worker["info"]["engine_loaded"] is False
    state, error = _outcome(_context(store, 30), lambda ctx: rt.engine)   # no reload: the same error
    assert state == "failed" and error["code"] == "model_unavailable" and "phi3" in error["message"]


def test_an_exhausted_pool_is_a_context_error_naming_the_pool_not_an_internal_error(store):
    """The web refuses what the pool cannot hold; a worker whose pool is smaller than the web
    believes (settings that disagree) still answers with the limit, never a 500."""
    from engine.paged.pool import KVPoolExhausted
    from worker.job_runner import _outcome

    def body(ctx):
        raise KVPoolExhausted("120 tokens need 30 blocks; the pool has 16")

    state, error = _outcome(_context(store, 30), body)
    assert state == "failed" and error["code"] == "context_exceeded" and "the pool has 16" in error["message"]


def test_a_beat_under_way_when_the_worker_leaves_is_not_left_behind(store):
    """A graceful stop (worker_process_shutdown) comes while the heartbeat thread is inside a
    beat: the worker is still unlisted afterwards, and no later beat lists it again."""
    inside, go_on = threading.Event(), threading.Event()

    class SlowEngine:
        def info(self):
            inside.set()
            go_on.wait(30)
            return {"model": "tiny"}

        def stats(self):
            return {}

    rt = WorkerRuntime(settings=load_settings(), store=store, name="w-leaving")
    rt._engine = SlowEngine()
    beat = threading.Thread(target=rt.beat)
    beat.start()
    assert inside.wait(30)
    leave = threading.Thread(target=rt.leave)
    leave.start()
    go_on.set()
    beat.join(30)
    leave.join(30)
    assert list_workers(store.client, max_age_s=60) == []
    rt.beat()
    assert list_workers(store.client, max_age_s=60) == []
