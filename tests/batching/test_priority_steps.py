"""A prompt of a more urgent class than every stream gets a step of its own: an interactive
chat beside batch streams waits one step, not a shared one. Order and counts, no clock."""
from __future__ import annotations

from core.settings import load_settings
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
