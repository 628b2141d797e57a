"""A prompt of a more urgent class than every stream gets a step of its own: an interactive
chat beside batch streams waits one step, not a shared one. Order and counts, no clock."""
from __future__ import annotations

from core.settings import load_settings
from engine.batching.arrivals import NONE
from engine.batching import Scheduler
from tests.batching.test_batching import _forward, _solo
from tests.batching.test_long_prompt import _add as add

INTERACTIVE, DEFAULT, BATCH = 0, 1, 2
BUDGET = 12


def _service(engine) -> Scheduler:
    return Scheduler.for_model(_forward(engine), load_settings(kv_block_size=4, kv_num_blocks=64, max_batch=8,
                                                        max_batched_tokens=BUDGET, prefill_tokens_while_decoding=1,
                                                        short_prompt_tokens=8), prefix_sharing=False)


def _add(engine, service, ids, max_new, log, name, priority):
    return add(engine, service, ids, max_new, log, name, priority, penalty=1.1)  # 1.1: as _solo


def _streams(engine, service, log, priority):
    streams = [_add(engine, service, [7 + i, 9, 11, 13], 30, log, f"s{i}", priority) for i in range(3)]
    while not all(seq.is_decoding for seq in streams):
        service.step()
    return streams


def _steps(service, log, count):
    out = []
    for _ in range(count):
        before = len(log)
        computed = service.step().computed
        out.append((computed, log[before:]))
    return out


def test_an_interactive_prompt_beside_batch_streams_runs_alone_then_shares(paged_engine):
    service, log = _service(paged_engine), []
    streams = _streams(paged_engine, service, log, BATCH)
    chat_ids = [21, 5, 33, 8, 40, 2, 17]                      # 7 tokens: short, computed whole
    chat = _add(paged_engine, service, chat_ids, 5, log, "chat", INTERACTIVE)
    steps = _steps(service, log, 3)
    assert steps[0] == (7, ["chat"])                          # its own step: the streams skip it
    assert steps[1] == (4, ["s0", "s1", "s2", "chat"])        # then everyone decodes together
    assert steps[2] == (4, ["s0", "s1", "s2", "chat"])
    while service.has_work:
        service.step()
    assert chat.run.token_ids == _solo(paged_engine, chat_ids, 5).token_ids
    assert all(seq.run.produced == 30 for seq in streams) and service.stats.preemptions == 0


def test_a_long_interactive_prompt_takes_whole_steps_until_its_first_token(paged_engine):
    """Beside streams a long prompt would go one token a step (prefill_tokens_while_decoding);
    outranking them, it takes the whole budget each step until it answers."""
    service, log = _service(paged_engine), []
    _streams(paged_engine, service, log, BATCH)
    long_ids = [(13 * i) % 150 + 3 for i in range(30)]        # 30 tokens: 12 + 12 + 6
    chat = _add(paged_engine, service, long_ids, 4, log, "chat", INTERACTIVE)
    steps = _steps(service, log, 4)
    assert steps[:3] == [(12, []), (12, []), (6, ["chat"])]
    assert steps[3] == (4, ["s0", "s1", "s2", "chat"])
    while service.has_work:
        service.step()
    assert chat.run.token_ids == _solo(paged_engine, long_ids, 4).token_ids


def test_a_prompt_of_the_streams_own_class_shares_their_step(paged_engine):
    service, log = _service(paged_engine), []
    _streams(paged_engine, service, log, DEFAULT)
    _add(paged_engine, service, [21, 5, 33, 8, 40, 2, 17], 5, log, "chat", DEFAULT)
    assert _steps(service, log, 1) == [(3 + 7, ["s0", "s1", "s2", "chat"])]


def test_a_batch_prompt_beside_interactive_streams_waits_its_turn_in_their_step(paged_engine):
    service, log = _service(paged_engine), []
    _streams(paged_engine, service, log, INTERACTIVE)
    _add(paged_engine, service, [21, 5, 33, 8, 40, 2, 17], 5, log, "job", BATCH)
    assert _steps(service, log, 1) == [(3 + 7, ["s0", "s1", "s2", "job"])]  # the streams never skip for it


class _ArrivesAtLayer:
    """The scheduler's ``arrivals`` (engine.batching.arrivals.Arrivals' ``flag``): nothing for
    the step's first ``layers`` reads, then ``priority`` (a request of that class is on its way
    in) until the test takes it."""

    def __init__(self, layers: int, priority: int):
        self.asked, self.layers, self.priority, self.taken = 0, layers, priority, False
        self.flag = self

    @property
    def value(self) -> int:
        self.asked += 1
        return NONE if self.taken or self.asked <= self.layers else self.priority


def test_a_batch_step_yields_to_an_interactive_arrival_and_runs_again_unchanged(paged_engine):
    """The arrival is noticed between layers: the step stops, streams nothing and keeps
    nothing; the chat's prompt takes the next step alone; the streams then decode as if the
    step had never started (the same tokens as alone, no preemption)."""
    service, log = _service(paged_engine), []
    streams = _streams(paged_engine, service, log, BATCH)
    arrival = service.arrivals = _ArrivesAtLayer(1, INTERACTIVE)
    before = len(log)
    out = service.step()
    assert (out.computed, out.streamed, log[before:]) == (0, [], [])
    assert service.stats.yielded == 1 and arrival.asked == 2   # stopped before the second layer
    arrival.taken = True                                      # the loop takes it from its inbox
    chat_ids = [21, 5, 33, 8, 40, 2, 17]
    chat = _add(paged_engine, service, chat_ids, 5, log, "chat", INTERACTIVE)
    assert _steps(service, log, 2) == [(7, ["chat"]), (4, ["s0", "s1", "s2", "chat"])]
    while service.has_work:
        service.step()
    assert chat.run.token_ids == _solo(paged_engine, chat_ids, 5).token_ids
    for i, seq in enumerate(streams):
        assert seq.run.token_ids == _solo(paged_engine, [7 + i, 9, 11, 13], 30).token_ids
    assert service.stats.yielded == 1 and service.stats.preemptions == 0


def test_a_step_never_yields_to_its_own_class_or_a_lower_one(paged_engine):
    service, log = _service(paged_engine), []
    _streams(paged_engine, service, log, DEFAULT)
    for priority in (DEFAULT, BATCH):
        service.arrivals = _ArrivesAtLayer(0, priority)
        assert service.step().computed == 3
    assert service.stats.yielded == 0


def test_an_interactive_prompt_goes_before_a_batch_prompt_mid_prefill(paged_engine):
    """No streams, a batch prompt halfway through its chunks: the chat's prompt takes the
    next step alone rather than wait behind the batch prompt's chunk."""
    service, log = _service(paged_engine), []
    long_ids = [(13 * i) % 150 + 3 for i in range(30)]        # 30 tokens: 12 + 12 + 6
    _add(paged_engine, service, long_ids, 4, log, "job", BATCH)
    assert service.step().computed == BUDGET                  # mid-prefill
    chat = _add(paged_engine, service, [21, 5, 33, 8, 40, 2, 17], 3, log, "chat", INTERACTIVE)
    assert _steps(service, log, 1) == [(7, ["chat"])]
    while service.has_work:                                   # then the job goes on beside the chat
        service.step()
    assert log.count("job") == 4 and chat.run.produced == 3
