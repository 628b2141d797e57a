"""The engine loop: one owner thread for all engine state; job threads only submit and consume."""
from __future__ import annotations

import queue
import threading

import pytest

from core.settings import load_settings
from engine.batching.scheduler import Scheduler
from engine.batching.sequence import FINISHED, Sequence
from engine.engine import Engine
from engine.loop import EngineLoop, RequestHandle
from engine.types import GenerationRequest, SamplingParams
from tests.accepted_tokens import record_accepted

USER = [{"role": "user", "content": "你好 world, compute 12 * 3 please"}]


def _req(method="paged", text=None, **sampling):
    sampling.setdefault("max_new_tokens", 12)
    messages = [{"role": "user", "content": text}] if text else USER
    return GenerationRequest(messages=messages, method=method, sampling=SamplingParams(**sampling))


@pytest.fixture
def engine(tiny_model_dir):
    """A fresh engine per test (a cold loop, its own caches), on the session's tiny model."""
    eng = Engine(load_settings(model=str(tiny_model_dir), dtype="float32", device="cpu",
                               kv_block_size=4, kv_num_blocks=512, max_batch=8,
                               max_batched_tokens=64))
    yield eng
    eng.close()


def _run_threads(targets):
    threads = [threading.Thread(target=t) for t in targets]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads)


def test_only_the_loop_thread_touches_engine_state(engine, monkeypatch):
    seen: set[int] = set()
    step, solo = Scheduler.step, Engine.run_solo
    monkeypatch.setattr(Scheduler, "step", lambda self: (seen.add(threading.get_ident()), step(self))[1])
    monkeypatch.setattr(Engine, "run_solo",
                        lambda self, *a: (seen.add(threading.get_ident()), solo(self, *a))[1])
    methods = ["paged", "custom_cache", "paged", "official", "prefix_cache", "paged", "no_cache", "paged"]
    results = {}
    _run_threads([lambda i=i, m=m: results.__setitem__(i, engine.generate(_req(m)))
                  for i, m in enumerate(methods)])
    assert len(results) == len(methods)
    assert seen == {engine.loop.owner} and engine.loop.owner != threading.get_ident()
    with pytest.raises(RuntimeError, match="loop thread"):
        engine.state("forward", lambda: None)          # from the test thread, while the loop runs
    with pytest.raises(RuntimeError, match="second thread"):
        engine.loop.call(lambda: engine.loop.paged).step()


def test_cold_engine_hit_by_8_threads_builds_one_paged_pool(engine, monkeypatch):
    built = []
    build = Scheduler.for_model.__func__
    monkeypatch.setattr(Scheduler, "for_model",
                        classmethod(lambda cls, *a, **k: (built.append(1), build(cls, *a, **k))[1]))
    barrier = threading.Barrier(8)

    def job(i):
        barrier.wait()
        engine.generate(_req(text=f"question {i}", max_new_tokens=4))

    _run_threads([lambda i=i: job(i) for i in range(8)])
    assert len(built) == 1
    stats = engine.loop.call(engine.stats)
    assert stats["paged"]["finished"] == 8 and stats["paged"]["blocks"]["blocks_used"] == 0


def test_a_failed_sequence_is_an_error_never_a_success(engine, monkeypatch):
    boom = RuntimeError("injected sampling failure")
    next_token = Sequence.next_token

    def failing(self, logits):
        if self.sampling.max_new_tokens == 13 and len(self.tokens) > len(self.prompt_ids) + 2:
            raise boom
        return next_token(self, logits)

    monkeypatch.setattr(Sequence, "next_token", failing)
    loop = engine.loop
    ok, bad = loop.submit(_req(max_new_tokens=12)), loop.submit(_req(max_new_tokens=13))
    with pytest.raises(RuntimeError, match="injected"):
        bad.stream(on_text=lambda piece: None)
    with pytest.raises(RuntimeError, match="injected"):
        bad.result(timeout=5)
    assert ok.result(timeout=30).finish_reason in ("length", "stop")


def test_finish_sets_the_error_before_finished():
    """A reader that sees FINISHED must also see the error (the order matters across threads)."""
    observed = []

    class Watched(Sequence):
        def __setattr__(self, name, value):
            if name == "status" and value == FINISHED:
                observed.append(self.error)
            super().__setattr__(name, value)

    class Blocks:
        def __contains__(self, seq_id):
            return False

    sched = Scheduler.__new__(Scheduler)
    sched.blocks, sched.running, sched.waiting, sched._ended = Blocks(), [], [], []
    from engine.batching.scheduler import StepStats
    sched.stats = StepStats()
    seq = Watched(seq_id=1, prompt_ids=[1], run=None, sampling=SamplingParams(), sampler=None)
    sched._finish(seq, error=ValueError("x"))
    assert isinstance(observed[0], ValueError)
    assert sched._take_ended() == [seq]  # the next step returns it (StepOutput.finished)


def test_a_stalled_consumer_does_not_stop_other_sequences(engine):
    """One job thread blocks in on_text (a Redis stall): the others keep streaming."""
    loop = engine.loop
    stalled, other = loop.submit(_req(text="stalled", max_new_tokens=20)), loop.submit(
        _req(text="other one", max_new_tokens=20))
    release, entered = threading.Event(), threading.Event()
    stalled_pieces: list[str] = []

    def stall(piece):
        entered.set()
        release.wait(30)
        stalled_pieces.append(piece)

    consumer = threading.Thread(target=lambda: stalled.stream(on_text=stall))
    consumer.start()
    assert entered.wait(30)
    other_pieces: list[str] = []
    other_result = other.stream(on_text=other_pieces.append)     # finishes while the first stalls
    assert release.is_set() is False and other_result.usage.completion_tokens >= 1
    assert "".join(other_pieces) == other_result.text
    assert stalled.future.done()          # the loop finished it too; its outputs wait in the queue
    release.set()
    consumer.join(30)
    assert "".join(stalled_pieces) == stalled.result().text


def test_non_batched_jobs_interleave_with_a_batched_job(engine, monkeypatch):
    """Read off the loop thread (tests/accepted_tokens.py): the batched job goes on streaming
    while the solo jobs run, token by token, whatever the machine's speed."""
    accepted = record_accepted(monkeypatch)
    loop = engine.loop
    gate = threading.Event()
    loop.post(gate.wait)                                    # all of it queued before the loop turns
    long_job = loop.submit(_req(text="a long batched answer", max_new_tokens=60, ignore_eos=True))
    solos = [loop.submit(_req(method, ignore_eos=True)) for method in ("custom_cache", "official", "no_cache")]
    gate.set()
    for handle in solos:
        assert handle.result(timeout=30).finish_reason == "length"
    assert long_job.result(timeout=30).usage.completion_tokens == 60
    methods = [a.method for a in accepted]
    solo_at = [i for i, m in enumerate(methods) if m != "paged"]
    paged_at = [i for i, m in enumerate(methods) if m == "paged"]
    assert len(paged_at) == 60 and len(solo_at) == 3 * 12
    assert any(solo_at[0] < i < solo_at[-1] for i in paged_at)  # streamed while the solos ran


class SteppedClock:
    """The loop's deadline clock, moved only by the test."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_the_deadline_counts_from_when_the_loop_starts_the_request(engine, monkeypatch):
    clock = SteppedClock()
    monkeypatch.setattr(RequestHandle, "clock", staticmethod(clock))
    loop = engine.loop
    gate = threading.Event()
    loop.post(gate.wait)                                    # the loop is busy until released
    handle = loop.submit(_req("custom_cache", max_new_tokens=6), timeout_s=0.5)
    assert handle.waiting
    clock.now += 10.0                                       # far past the deadline, while queued
    assert handle.waiting                                   # still queued: no clock yet
    gate.set()
    result = handle.result(timeout=30)
    assert not handle.timed_out and result.finish_reason in ("length", "stop")

    def ticking(_engine, _prompt, run, _request, _penalty) -> int:
        while True:                                         # the deadline passes after 3 tokens
            if run.produced == 3:
                clock.now += 1.0
            if run.accept(10):
                return 0

    engine.register_method("ticking", ticking)
    stopped = loop.submit(_req("ticking", max_new_tokens=100), timeout_s=0.5)
    result = stopped.result(timeout=30)
    assert stopped.timed_out and result.finish_reason == "cancelled"
    assert 3 <= result.usage.completion_tokens <= 4         # stopped at its next token
    late = loop.submit(_req("custom_cache", max_new_tokens=6), timeout_s=0.0)
    assert late.result(timeout=30).finish_reason == "cancelled" and late.timed_out


def test_cancel_reaches_the_loop_as_a_flag(engine):
    handle = engine.loop.submit(_req(max_new_tokens=200))
    pieces: list[str] = []
    result = handle.stream(on_text=pieces.append, should_cancel=lambda: len(pieces) >= 2)
    assert result.finish_reason in ("cancelled", "stop")
    stats = engine.loop.call(engine.stats)
    assert stats["paged"]["running"] == 0 and stats["paged"]["blocks"]["blocks_used"] == 0


def test_closing_the_loop_ends_queued_requests_with_an_error(engine):
    from engine.loop import LoopClosedError

    loop = EngineLoop(engine, paged=None)
    gate = threading.Event()
    loop.post(gate.wait)
    handle = loop.submit(_req("custom_cache"))
    closer = threading.Thread(target=loop.close)
    closer.start()
    gate.set()
    closer.join(10)
    with pytest.raises(LoopClosedError):
        handle.result(timeout=5)
    with pytest.raises(LoopClosedError):
        loop.submit(_req("custom_cache"))


def _probe_method(events: list[str], fail_after: int | None = None):
    """A registered method that feeds token 10 until told to stop, failing after ``fail_after``."""
    def runner(_engine, _prompt, run, _request, _penalty) -> int:
        try:
            while True:
                if fail_after is not None and run.produced >= fail_after:
                    raise ValueError("the method broke")
                if run.accept(10):
                    return 0
        finally:
            events.append("unwound")
    return runner


def test_closing_the_loop_unwinds_running_solo_tasks(engine, monkeypatch):
    from engine.loop import LoopClosedError
    from engine.run import GenerationRun

    events: list[str] = []
    engine.register_method("probe", _probe_method(events))
    loop = engine.loop
    running: set[int] = set()
    all_running = threading.Event()
    accept = GenerationRun.accept

    def noting(run: GenerationRun, token_id: int) -> bool:
        running.add(id(run))                         # on the loop thread: this task has begun
        if len(running) == 3:
            all_running.set()
        return accept(run, token_id)

    monkeypatch.setattr(GenerationRun, "accept", noting)
    handles = [loop.submit(_req("probe", max_new_tokens=10**6)) for _ in range(2)]
    handles.append(loop.submit(_req("official", max_new_tokens=10**4)))
    assert all_running.wait(30)                      # all three mid-run (a safety net, not a measure)
    loop.close()
    assert events == ["unwound", "unwound"]          # their finally blocks ran, on the loop thread
    for handle in handles:
        with pytest.raises(LoopClosedError):
            handle.result(timeout=5)
        outcomes = []
        while not handle.outputs.empty():
            outcomes.append(handle.outputs.get()[0])
        assert outcomes.count("error") == 1 and "result" not in outcomes


def test_an_error_in_one_solo_job_fails_that_job_only(engine):
    events: list[str] = []
    engine.register_method("probe", _probe_method(events, fail_after=3))
    loop = engine.loop
    broken = loop.submit(_req("probe", max_new_tokens=50))
    fine = [loop.submit(_req(m, max_new_tokens=20)) for m in ("official", "custom_cache", "paged")]
    with pytest.raises(ValueError, match="broke"):
        broken.result(timeout=30)
    for handle in fine:
        assert handle.result(timeout=30).usage.completion_tokens > 0
    assert events == ["unwound"]


@pytest.mark.parametrize("method", ["paged", "custom_cache"])
def test_each_piece_comes_with_the_tokens_generated_so_far(engine, method):
    """What a client plots tokens over time from: the count never falls, and the last
    piece's count is the result's completion tokens, or one less (an end-of-text token
    brings no text)."""
    handle = engine.loop.submit(_req(method, max_new_tokens=24, temperature=0.0))
    counts: list[int] = []
    result = handle.stream(on_text=lambda piece: counts.append(handle.tokens_streamed))
    assert counts and counts == sorted(counts) and counts[0] >= 1
    assert counts[-1] <= result.usage.completion_tokens <= counts[-1] + 1
    assert handle.tokens_streamed == counts[-1]


def test_the_loop_counts_requests_on_their_way_in_by_class(engine):
    """What a running step asks between layers (engine.batching.arrivals): a request put in
    the inbox counts for its class until the loop takes it, then no longer."""
    engine.generate(_req(max_new_tokens=2))                  # the loop and its scheduler exist
    loop = engine.loop
    assert loop.call(lambda: loop.paged.arrivals is loop._arrivals, timeout=30)
    gate, held = threading.Event(), threading.Event()
    loop.post(lambda: (held.set(), gate.wait(30)))            # the loop is busy between steps
    assert held.wait(30)
    batch = GenerationRequest(messages=USER, method="paged", sampling=SamplingParams(max_new_tokens=2), priority=2)
    chat = GenerationRequest(messages=USER, method="paged", sampling=SamplingParams(max_new_tokens=2), priority=0)
    handles = [loop.submit(batch)]
    assert loop._arrivals.best() == 2
    handles.append(loop.submit(chat))
    assert loop._arrivals.best() == 0
    gate.set()
    for handle in handles:
        assert handle.result(timeout=60).token_ids
    assert loop._arrivals.best() is None


@pytest.mark.parametrize("method", ["paged", "custom_cache"])
def test_a_step_gate_holds_a_running_request_between_permits(engine, method, monkeypatch):
    """What the full-path tests hold a job running with (worker/step_gate.py): the loop runs a
    turn's steps only when its gate says so, and no token comes without that; a gate opened
    lets the request finish."""
    accepted = record_accepted(monkeypatch)
    decisions: queue.Queue[bool] = queue.Queue()
    tokens_at_gate: queue.Queue[int] = queue.Queue()

    def gate() -> bool:  # the test decides each turn
        tokens_at_gate.put(len(accepted))
        return decisions.get(timeout=30)

    engine.loop.gate_steps(gate).result(30)
    handle = engine.loop.submit(_req(method, max_new_tokens=40, temperature=0.0, ignore_eos=True))
    seen = [tokens_at_gate.get(timeout=30)]
    for allow in (True, True, True, False, False):
        decisions.put(allow)
        seen.append(tokens_at_gate.get(timeout=30))
    assert seen[0] == 0 and seen[1] <= seen[2] < seen[3]  # permitted turns make tokens (the first: the prompt)
    assert seen[3] == seen[4] == seen[5]  # refused turns make none
    assert not handle.future.done()
    engine.loop.gate_steps(lambda: True)  # taken in the turn after the next permitted one
    decisions.put(True)
    assert handle.result(timeout=60).usage.completion_tokens == 40
