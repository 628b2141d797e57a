"""A long prompt shares the engine without starving anyone: each step spends at most the
prefill budget, every streaming sequence gets its token every step while the long prompt
prefills, a prompt that finds no blocks waits instead of evicting a streaming sequence, and
prompts that together need more than the pool never deadlock. Order and counts, no clock."""
from __future__ import annotations

from core.settings import load_settings
from engine.batching import Scheduler
from engine.run import GenerationRun
from engine.types import SamplingParams
from tests.batching.test_batching import _forward, _solo

BLOCK, BLOCKS, BUDGET = 4, 40, 12          # a pool of 160 tokens, 12 tokens a step


def _service(engine, blocks: int = BLOCKS) -> Scheduler:
    # Prompts may fill the whole step beside decodes here (the default budget while decoding
    # is smaller: the last test of the file checks that bound on its own).
    return Scheduler.for_model(_forward(engine), load_settings(kv_block_size=BLOCK, kv_num_blocks=blocks, max_batch=8,
                                                        max_batched_tokens=BUDGET,
                                                        prefill_tokens_while_decoding=BUDGET), prefix_sharing=False)


def _add(engine, service, ids, max_new, log, name, priority=1, penalty=1.0):
    """Submit a sequence whose accepted tokens append ``name`` to ``log`` (the steps' order)."""
    run = GenerationRun(engine.loaded.tokenizer, method="paged", max_new_tokens=max_new, eos_ids=[])
    accept = run.accept

    def recording_accept(token: int) -> bool:
        log.append(name)
        return accept(token)

    run.accept = recording_accept
    seq = service.new_sequence(list(ids), run, SamplingParams(max_new_tokens=max_new), penalty, priority=priority)
    service.submit(seq)
    return seq


def test_streams_get_a_token_every_step_while_a_long_prompt_prefills_and_it_never_evicts_them(paged_engine):
    service = _service(paged_engine)
    log: list[str] = []
    short = [_add(paged_engine, service, [7 + i, 9, 11, 13], 40, log, f"s{i}") for i in range(3)]
    while not all(seq.is_decoding for seq in short):   # the three are streaming
        service.step()
    long_ids = [(17 * i) % 200 + 3 for i in range(100)]  # 100 tokens + 4 new: 26 of the 40 blocks
    hog = _add(paged_engine, service, long_ids, 4, log, "hog")
    steps = []
    while service.has_work:
        before = len(log)
        computed = service.step().computed
        steps.append((computed, log[before:]))
    assert all(computed <= BUDGET for computed, _ in steps)          # the prefill budget bounds a step
    assert steps[0][0] == BUDGET and steps[0][1] == ["s0", "s1", "s2"]  # 3 decodes + 9 of the hog's prompt
    for computed, names in steps[:20]:                                # while the hog prefills...
        assert names == ["s0", "s1", "s2"], names                    # ...each stream gets one token a step
    assert [seq.preemptions for seq in short] == [0, 0, 0]          # and no stream was preempted for it
    assert hog.run.produced == 4 and all(seq.run.produced == 40 for seq in short)
    assert hog.run.token_ids == _solo(paged_engine, long_ids, 4).token_ids  # chunked prefill: same tokens


def test_a_prompt_without_blocks_waits_and_the_streams_keep_their_blocks(paged_engine):
    """The pool is nearly full of streams: the long prompt waits for blocks (it gets them as
    streams finish) rather than taking their next block; nothing is preempted."""
    service = _service(paged_engine, blocks=30)                    # 120 tokens
    log: list[str] = []
    short = [_add(paged_engine, service, [5 + i, 8, 6, 2], 36, log, f"s{i}") for i in range(2)]  # 2 x 40 tokens
    while not all(seq.is_decoding for seq in short):
        service.step()
    hog = _add(paged_engine, service, [(13 * i) % 150 + 3 for i in range(96)], 4, log, "hog")  # 100 > what is left
    while service.has_work:
        service.step()
    assert [seq.preemptions for seq in short] == [0, 0] and service.stats.preemptions == 0
    assert all(seq.run.produced == 36 for seq in short) and hog.run.produced == 4
    assert log.index("hog") > max(i for i, name in enumerate(log) if name != "hog")  # it waited for them
    assert service.blocks.stats().blocks_used == 0


def test_two_prompts_that_together_overfill_the_pool_both_finish(paged_engine):
    """Each fits the pool alone, not both at once: the newer gives its blocks back when both
    are stuck, the older finishes, then the newer runs (no deadlock, same tokens as alone)."""
    service = _service(paged_engine, blocks=30)                    # 120 tokens
    log: list[str] = []
    prompts = [[(11 * i + k) % 180 + 3 for i in range(90)] for k in range(2)]  # 2 x (90 + 6) > 120
    seqs = [_add(paged_engine, service, ids, 6, log, f"p{k}") for k, ids in enumerate(prompts)]
    steps = 0
    while service.has_work:
        service.step()
        steps += 1
        assert steps < 500, "the scheduler made no progress"
    for ids, seq in zip(prompts, seqs):
        assert seq.error is None and seq.run.token_ids == _solo(paged_engine, ids, 6).token_ids
    assert service.blocks.stats().blocks_used == 0


def test_streams_that_arrive_while_a_long_prompt_prefills_are_never_preempted_for_it(paged_engine):
    """The long prompt came first and is mid-prefill when three short chats arrive: they are
    admitted, stream a token every step, and when the pool runs short it is the long prompt
    (nothing streamed yet, most blocks held) that waits or gives blocks back, never them."""
    service = _service(paged_engine)
    log: list[str] = []
    long_ids = [(19 * i) % 200 + 3 for i in range(120)]                # 120 + 4 tokens: 31 of 40 blocks
    hog = _add(paged_engine, service, long_ids, 4, log, "hog")
    for _ in range(3):
        service.step()                                                  # 36 of its tokens computed
    short = [_add(paged_engine, service, [7 + i, 9, 11, 13], 40, log, f"s{i}") for i in range(3)]
    while service.has_work:
        service.step()
    assert [seq.preemptions for seq in short] == [0, 0, 0]
    assert all(seq.run.produced == 40 for seq in short) and hog.run.produced == 4
    assert hog.run.token_ids == _solo(paged_engine, long_ids, 4).token_ids
    assert service.blocks.stats().blocks_used == 0


def test_beside_streams_a_step_adds_at_most_the_while_decoding_budget_of_prompt(paged_engine):
    """Every stream waits for the whole step, so while sequences decode a step carries at most
    MINISERVE_PREFILL_TOKENS_WHILE_DECODING prompt tokens; alone, a prompt takes the full budget."""
    service = Scheduler.for_model(_forward(paged_engine), load_settings(
        kv_block_size=BLOCK, kv_num_blocks=BLOCKS, max_batch=8, max_batched_tokens=BUDGET,
        prefill_tokens_while_decoding=2, short_prompt_tokens=0), prefix_sharing=False)
    steps = _recorded_steps(service)
    log: list[str] = []
    short = [_add(paged_engine, service, [7 + i, 9, 11, 13], 10, log, f"s{i}") for i in range(2)]
    service.step()                                                    # both prompts, then they stream
    hog = _add(paged_engine, service, [(7 * i) % 200 + 3 for i in range(60)], 2, log, "hog")
    while service.has_work:
        service.step()
    beside = [prompt for decodes, prompt in steps if decodes]
    assert beside and max(beside) <= 2                                # beside streams: 2 prompt tokens a step
    assert max(prompt for decodes, prompt in steps if not decodes) == BUDGET  # alone: the whole budget
    assert hog.run.produced == 2 and all(seq.run.produced == 10 for seq in short)


def _recorded_steps(service) -> list[tuple[int, int]]:
    """(decode tokens, prompt tokens) of each forward the service runs from now on."""
    steps: list[tuple[int, int]] = []
    forward = service._forward

    def recording(plan):
        decodes = sum(1 for seq, _ in plan if seq.is_decoding)
        steps.append((decodes, sum(count for _, count in plan) - decodes))
        return forward(plan)

    service._forward = recording
    return steps


def test_beside_streams_a_short_prompt_goes_whole_and_a_long_ones_last_chunk_too(paged_engine):
    """Prompts whose rest is at most MINISERVE_SHORT_PROMPT_TOKENS are computed whole beside
    streams (a chat answers at once); a long prompt goes 2 tokens a step until its rest is
    that short, then finishes in one step."""
    service = Scheduler.for_model(_forward(paged_engine), load_settings(
        kv_block_size=BLOCK, kv_num_blocks=BLOCKS, max_batch=8, max_batched_tokens=BUDGET,
        prefill_tokens_while_decoding=2, short_prompt_tokens=8), prefix_sharing=False)
    steps = _recorded_steps(service)
    log: list[str] = []
    short = [_add(paged_engine, service, [7 + i, 9, 11, 13], 30, log, f"s{i}") for i in range(2)]
    service.step()                                                    # both prompts, then they stream
    chat = _add(paged_engine, service, [5, 6, 7, 8, 9, 10], 2, log, "chat")
    service.step()
    assert steps[-1] == (2, 6)                                        # the chat's 6 tokens at once
    hog = _add(paged_engine, service, [(7 * i) % 200 + 3 for i in range(20)], 2, log, "hog")
    while service.has_work:
        service.step()
    hog_steps = [prompt for decodes, prompt in steps[2:] if decodes and prompt]
    assert hog_steps == [2] * 6 + [8]                                 # 20 = 6 chunks of 2, then the last 8
    assert chat.run.produced == 2 and hog.run.produced == 2 and all(seq.run.produced == 30 for seq in short)
