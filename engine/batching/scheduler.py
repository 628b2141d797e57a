"""Continuous batching over the paged KV cache: one batched forward per step.

Each :meth:`Scheduler.step`
1. drops cancelled sequences (and when a prompt outranks every streaming sequence, an
   interactive chat beside batch streams, the step runs the prompts of its class alone, with
   the whole token budget, and the streams skip it: the chat waits one step, not a shared one);
2. gives every running sequence past its prompt one decode token (taking a new block only
   when its last is full; when none is left it *preempts* a sequence: one that has streamed
   nothing yet and holds the most blocks, else the most recently admitted; it frees its
   blocks and goes back to the head of the queue, to be recomputed);
3. continues prompts that are being prefilled in chunks, each taking blocks for its next
   chunk only, and never the blocks the decoding sequences may still need up to their max
   tokens: a prompt that finds none waits for them (a long prompt never evicts a stream);
4. admits waiting sequences by priority class, first-come first-served within a class, while the batch has room
   (``max_batch``), the step's token budget lasts (``max_batched_tokens``; while sequences
   decode, prompts add at most ``prefill_while_decoding`` tokens to the step, since every
   stream waits for the whole step: a long prompt beside streams goes slowly, then at full
   budget once nobody streams; prompts whose rest is at most ``short_prompt_tokens`` share
   that many tokens of the step on top, whole, so a chat starts answering at once) and the pool has blocks for the prompt's cached prefix and
   first chunk (plus one spare block per running sequence);
5. runs ONE forward over all scheduled tokens (decodes, chunks and fresh prompts packed
   together), samples a token for each sequence that reached its end, and feeds it to the
   sequence's run (streaming text, stop strings, max tokens, cancellation).
A sequence that finishes, fails or is cancelled gives back its blocks and leaves; the others
carry on untouched. The step returns what it did (:class:`StepOutput`, as nano-vllm's
``step()`` does): the sequences that took tokens (their runs hold the text to hand out) and
those that ended; the caller hands them out, nothing is called back from inside the step.
Not thread-safe by design: one thread (the engine loop,
:mod:`engine.loop`) owns a scheduler. The first :meth:`step` records that thread, and a step
from any other thread raises (cheap guard against reintroducing shared driving).
"""
from __future__ import annotations

import itertools
import logging
import threading
from collections import deque
from typing import Any

import torch

from core.logs import log_event
from core.prefix_hash import ROOT_HASH
from engine.batching.arrivals import Arrivals, Interrupt
from engine.batching.sequence import FINISHED, RUNNING, WAITING, Sequence
from engine.batching.step_types import StepOutput, StepStats, PromptBudget
from engine.forward import Qwen2Forward
from engine.paged.attention import SeqChunk, build_batch
from engine.paged.block_manager import BlockManager
from engine.paged.forward import PagedQwen2, StepYielded
from engine.paged.pool import KVBlockPool, KVGeometry, KVPoolExhausted, blocks_for_budget
from engine.run import GenerationRun
from engine.sampling import Sampler
from engine.speculative.config import spec_config
from engine.speculative.paged import reserve_drafts, settle_drafts
from engine.speculative.policy import SpecState
from engine.types import SamplingParams

logger = logging.getLogger("miniserve.engine.scheduler")


class Scheduler:
    def __init__(self, model: PagedQwen2, pool: KVBlockPool, blocks: BlockManager, *,
                 max_batch: int, max_batched_tokens: int, prefill_while_decoding: int | None = None,
                 short_prompt_tokens: int = 0):
        if max_batch <= 0 or max_batched_tokens <= 0:
            raise ValueError("max_batch and max_batched_tokens must be positive")
        self.model, self.pool, self.blocks = model, pool, blocks
        self.max_batch = max_batch
        self.max_batched_tokens = max_batched_tokens
        # prompt tokens a step adds beside decoding sequences (None: the whole budget)
        self.prefill_while_decoding = prefill_while_decoding or max_batched_tokens
        # ...except that prompts whose rest is this short share this many tokens of a step on
        # top: a chat's prompt starts answering at once instead of a few tokens a step
        self.short_prompt_tokens = short_prompt_tokens
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.stats = StepStats()
        self.owner: int | None = None   # ident of the one thread that steps this scheduler
        self._ended: list[Sequence] = []  # ended since the last step returned them
        self._ids = itertools.count(1)
        self.settings: Any = None       # set by for_model: speculative decoding reads it
        # requests on their way in, by class (engine.batching.arrivals): set by the loop
        self.arrivals: Arrivals | None = None

    @classmethod
    def for_model(cls, forward: Qwen2Forward, settings: Any, *, num_blocks: int | None = None,
                  prefix_sharing: bool = True) -> "Scheduler":
        """One engine loop's paged cache: the block pool (sized from settings), the block
        manager and the scheduler over them, built on the loop thread."""
        model = PagedQwen2(forward)
        blocks = num_blocks or pool_blocks(settings, model.geometry, model.dtype)
        scheduler = cls(model, model.make_pool(blocks, settings.kv_block_size),
                        BlockManager(blocks, settings.kv_block_size, prefix_sharing=prefix_sharing),
                        max_batch=settings.max_batch, max_batched_tokens=settings.max_batched_tokens,
                        prefill_while_decoding=settings.prefill_tokens_while_decoding,
                        short_prompt_tokens=settings.short_prompt_tokens)
        scheduler.settings = settings
        log_event(logger, "paged_pool_ready", num_blocks=blocks, block_size=settings.kv_block_size,
                  pool_mib=round(scheduler.pool.nbytes / 2**20, 1))
        return scheduler

    def new_sequence(self, prompt_ids: list[int], run: GenerationRun, sampling: SamplingParams, penalty: float,
                     speculative: bool | None = None, constraint: Any = None, cache_root: int = ROOT_HASH,
                     priority: int = 1) -> Sequence:
        """``speculative``: the request's flag (None: ``MINISERVE_SPECULATIVE`` decides).
        ``constraint``: this sequence's own grammar state (its mask applies to its row only);
        a constrained sequence does not draft (drafts are not checked against the grammar).
        ``cache_root``: its cache salt's chain root (it shares prefix blocks only within it).
        ``priority``: its class rank (0 interactive .. 2 batch): admitted first, preempted last."""
        sampler = Sampler(sampling, penalty, self.model.vocab_size, prompt_ids, self.pool.device,
                          constraint=constraint, record=run.logprobs, eos_ids=run.eos_ids,
                          resumed=run.token_ids[:run.resumed])
        forward = self.model.forward_model
        spec = spec_config(self.settings, speculative, forward.weights) if constraint is None else None
        return Sequence(seq_id=next(self._ids), prompt_ids=list(prompt_ids), run=run, sampling=sampling,
                        sampler=sampler, spec=SpecState.start(spec, prompt_ids) if spec else None,
                        cache_root=cache_root, priority=priority)

    def snapshot(self) -> dict[str, Any]:
        """For logs and the monitor: queue sizes, batch figures and block usage."""
        s = self.stats
        return {"running": len(self.running), "waiting": len(self.waiting),
                "batch_size": s.last_batch_size, "max_batch_size": s.max_batch_size,
                "steps": s.steps, "tokens_computed": s.tokens, "tokens_sampled": s.sampled,
                "preemptions": s.preemptions, "finished": s.finished,
                "draft_tokens": s.draft_tokens, "accepted_draft_tokens": s.accepted_draft_tokens, "yielded": s.yielded,
                "blocks": self.blocks.stats().to_dict(), "block_map": self.blocks.block_map()}

    # ------------------------------------------------------------------ queue
    def submit(self, seq: Sequence) -> None:
        """The sequence joins the waiting queue (owner thread only): behind every waiting
        sequence of its class or a higher one, ahead of lower classes, so admission goes
        by class and first-come first-served within a class."""
        seq.status = WAITING
        at = next((i for i, other in enumerate(self.waiting) if other.priority > seq.priority),
                  len(self.waiting))
        self.waiting.insert(at, seq)

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def _check_owner(self) -> None:
        me = threading.get_ident()
        if self.owner is None:
            self.owner = me
        elif self.owner != me:
            raise RuntimeError("Scheduler.step called from a second thread")

    # ------------------------------------------------------------------ one step
    def step(self) -> StepOutput:
        """Advance every scheduled sequence by one forward; returns what it did."""
        self._check_owner()
        self._drop_cancelled()
        plan = self._schedule()
        if not plan:
            return StepOutput(finished=self._take_ended())
        try:
            logits = self._forward(plan)
        except StepYielded:                 # a better class arrived: its prompt goes first
            self.stats.yielded += 1
            return StepOutput(finished=self._take_ended())
        except Exception as exc:  # noqa: BLE001 - fail this step's sequences, keep serving
            log_event(logger, "batch_step_failed", error=type(exc).__name__, batch=len(plan))
            for seq, _ in plan:
                self._finish(seq, error=exc)
            return StepOutput(finished=self._take_ended())
        row = 0
        for seq, count in plan:
            if seq.drafts:                  # rows: the pending token's and each draft's
                rows = 1 + len(seq.drafts)
                self._verify(seq, logits[row:row + rows])
                row += rows
                continue
            seq.num_computed += count
            self.blocks.commit(seq.seq_id, seq.num_computed)
            if seq.num_pending == 0:
                self._sample(seq, logits[row])
            row += 1
        num_tokens = sum(count for _, count in plan)
        s = self.stats
        s.steps += 1
        s.tokens += num_tokens
        s.last_batch_size, s.last_num_tokens = len(plan), num_tokens
        s.max_batch_size = max(s.max_batch_size, len(plan))
        return StepOutput(num_tokens, [seq for seq, _ in plan if not seq.finished], self._take_ended())

    def _take_ended(self) -> list[Sequence]:
        ended, self._ended = self._ended, []
        return ended

    def _forward(self, plan: list[tuple[Sequence, int]]) -> torch.Tensor:
        """One forward over the plan; logits of each sequence's last token, or of its
        last ``1 + drafts`` tokens when it verifies drafts (in plan order)."""
        chunks, ids, rows = [], [], []
        for seq, count in plan:
            chunks.append(SeqChunk(self.blocks.block_table(seq.seq_id), seq.num_computed, count))
            ids.extend(seq.tokens[seq.num_computed:seq.num_computed + count - len(seq.drafts)])
            ids.extend(seq.drafts)
            rows.extend(range(len(ids) - 1 - len(seq.drafts), len(ids)))
        device = self.pool.device
        batch = build_batch(chunks, self.pool.block_size, device)
        speculating = len(rows) > len(plan)
        decode_only = all(count == 1 + len(seq.drafts) for seq, count in plan)
        return self.model.forward(torch.tensor(ids, dtype=torch.long, device=device), batch, self.pool,
                                  rows=torch.tensor(rows, device=device) if speculating else None,
                                  decode_only=decode_only, interrupt=self._interrupt(plan, speculating))

    def _interrupt(self, plan: list[tuple[Sequence, int]], speculating: bool) -> Interrupt | None:
        """What the forward asks between layers: has a request arrived whose class outranks
        every sequence of this step, and is there room to admit it? Then the step yields
        (:class:`StepYielded`) and the newcomer's prompt takes the next step alone (see
        :meth:`_outranking_class`). At most one wasted step per such arrival: the loop takes
        it from the inbox before the next step. Never a step that verifies drafts (their
        blocks and counts are settled by the step itself)."""
        arrivals = self.arrivals
        if arrivals is None or speculating or len(self.running) >= self.max_batch:
            return None
        rank = min(seq.priority for seq, _ in plan)
        return Interrupt(arrivals, rank) if rank > 0 else None

    def _sample(self, seq: Sequence, logits: torch.Tensor) -> None:
        try:
            token = seq.next_token(logits)
            self.stats.sampled += 1
            if seq.run.accept(token):
                self._finish(seq)
            else:
                seq.tokens.append(token)
        except Exception as exc:  # noqa: BLE001 - e.g. the caller's on_text failed
            self._finish(seq, error=exc)

    def _verify(self, seq: Sequence, rows: torch.Tensor) -> None:
        """Accept the longest agreeing run of drafts and feed the tokens to the run one at a
        time, stopping at the first stop condition (nothing streamed is taken back)."""
        drafted = len(seq.drafts)
        try:
            emitted = settle_drafts(seq, self.blocks, rows)
            self.stats.draft_tokens += drafted
            self.stats.accepted_draft_tokens += len(emitted) - 1
            for token in emitted:
                self.stats.sampled += 1
                if seq.run.accept(token):
                    self._finish(seq)
                    return
                seq.tokens.append(token)
        except Exception as exc:  # noqa: BLE001 - e.g. the caller's on_text failed
            self._finish(seq, error=exc)

    # ------------------------------------------------------------------ scheduling
    def _schedule(self) -> list[tuple[Sequence, int]]:
        plan = self._plan()
        while not plan and self.running:  # every running prompt is blocked on blocks
            self._unblock()
            plan = self._plan()
        return plan

    def _plan(self) -> list[tuple[Sequence, int]]:
        urgent = self._outranking_class()
        if urgent is not None:                              # 0. a more urgent prompt alone
            plan = self._prompts([], self.max_batched_tokens, urgent)
            if plan:
                return plan
        budget = self.max_batched_tokens
        plan: list[tuple[Sequence, int]] = []
        for seq in list(self.running):                      # 1. decodes
            if budget == 0:
                break
            if seq.status == RUNNING and seq.is_decoding and self._reserve_slot(seq):
                plan.append((seq, 1))
                budget -= 1
        if plan:                                            # their speculative drafts
            budget -= reserve_drafts([seq for seq, _ in plan], self.blocks, budget, spare=len(self.running))
            plan = [(seq, 1 + len(seq.drafts)) for seq, _ in plan]
        return self._prompts(plan, budget)

    def _outranking_class(self) -> int | None:
        """The class of a prompt (waiting at the head, or mid-prefill) that outranks every
        streaming sequence (or, with no streams, some prompt mid-prefill), or None. Its step
        runs prompts of that class or better alone, with the whole budget: an interactive chat
        beside batch streams waits for one step, not for a step that also decodes every stream
        or a batch prompt's chunk (they skip that step)."""
        prompts = [seq.priority for seq in self.running if not seq.is_decoding]
        if self.waiting and len(self.running) < self.max_batch:
            prompts.append(self.waiting[0].priority)
        best = min(prompts, default=None)
        if best is None:
            return None
        streams = [seq.priority for seq in self.running if seq.is_decoding]
        if streams:
            return best if best < min(streams) else None
        # nobody streams: only lower classes' prompts mid-prefill, which would go first
        return best if any(seq.priority > best for seq in self.running) else None

    def _prompts(self, plan: list[tuple[Sequence, int]], budget: int,
                 rank: int | None = None) -> list[tuple[Sequence, int]]:
        """Add prompt tokens to ``plan`` (prompts of class ``rank`` or better only, when given)."""
        spare = sum(self._still_needs(seq) for seq in self.running if seq.is_decoding)  # prompts never
        prompts = PromptBudget(budget, self.prefill_while_decoding if plan else budget,  # take a stream's blocks;
                                self.short_prompt_tokens if plan else 0)                # streams wait for this step
        for seq in self.running:                            # 2. prompts mid-prefill
            if not prompts.left:
                break
            if rank is not None and seq.priority > rank:
                continue
            granted = prompts.grant(seq.num_pending)
            if granted and not seq.is_decoding and all(seq is not p for p, _ in plan):
                count = self._grow(seq, granted, spare)
                if count:
                    plan.append((seq, count))
                    prompts.spend(seq.num_pending, count)
        while self.waiting and prompts.left and len(self.running) < self.max_batch:  # 3. admit
            seq = self.waiting[0]
            if rank is not None and seq.priority > rank:
                break
            rest = len(seq.tokens) - self.blocks.cached_prefix_tokens(seq.tokens, root=seq.cache_root)
            granted = prompts.grant(rest)
            count = self._admit(seq, granted) if granted else None  # no room for it this step
            if count is None:
                break
            if count:
                plan.append((seq, count))
                prompts.spend(rest, count)
        return plan

    def _admit(self, seq: Sequence, budget: int) -> int | None:
        """Admit the head of the queue with blocks for its cached prefix and its first chunk
        only (a long prompt takes its blocks chunk by chunk, as it computes them); the tokens
        it runs this step, 0 when it failed (it can never fit), or None when it must wait."""
        hits = self.blocks.cached_prefix_tokens(seq.tokens, root=seq.cache_root)
        upto = hits + min(len(seq.tokens) - hits, budget)
        if not self.blocks.can_allocate(seq.tokens[:upto], reserve=len(self.running), root=seq.cache_root):
            if not self.running and not self._fits_alone(seq):
                self.waiting.popleft()
                self._finish(seq, error=KVPoolExhausted(
                    f"{len(seq.tokens)} tokens need {self.blocks.blocks_needed(len(seq.tokens))}"
                    f" blocks; the pool has {self.blocks.num_blocks}"))
                return 0
            return None
        self.waiting.popleft()
        cached = self.blocks.allocate(seq.seq_id, seq.tokens[:upto], root=seq.cache_root)
        if seq.cached_tokens is None:
            seq.cached_tokens = cached
        seq.num_computed, seq.status = cached, RUNNING
        self.running.append(seq)
        return upto - cached

    def _still_needs(self, seq: Sequence) -> int:
        """Blocks a streaming sequence may still take before it ends (at its max tokens)."""
        final = len(seq.prompt_ids) + seq.run.max_new_tokens
        return max(0, self.blocks.blocks_needed(final) - self.blocks.blocks_needed(self.blocks.num_tokens(seq.seq_id)))

    def _fits_alone(self, seq: Sequence) -> bool:
        return self.blocks.blocks_needed(len(seq.tokens)) <= self.blocks.num_blocks

    def _grow(self, seq: Sequence, count: int, spare: int) -> int:
        """Blocks for a prompt's next ``count`` tokens, keeping ``spare`` blocks free: what the
        streaming sequences may still need up to their max tokens. Fewer tokens when fewer
        fit, 0 when it must wait (a prompt waits for blocks rather than take a stream's)."""
        held = self.blocks.num_tokens(seq.seq_id)
        end = seq.num_computed + count
        if end <= held:
            return count
        room = (self.blocks.num_available - spare) * self.blocks.block_size + self._slack(seq)
        end = min(end, held + max(0, room))
        if end > held:
            self.blocks.append(seq.seq_id, seq.tokens[held:end])
        return max(0, end - seq.num_computed)

    def _slack(self, seq: Sequence) -> int:
        """Free slots in the sequence's last block."""
        held = self.blocks.num_tokens(seq.seq_id)
        return self.blocks.blocks_needed(held) * self.blocks.block_size - held

    def _reserve_slot(self, seq: Sequence) -> bool:
        """Give ``seq`` a slot for its newest token, preempting others if needed (see
        :meth:`_victim`). False when ``seq`` itself had to be preempted."""
        missing = len(seq.tokens) - self.blocks.num_tokens(seq.seq_id)
        if missing <= 0:
            return True
        while self.blocks.append_cost(seq.seq_id, missing) > self.blocks.num_available:
            victim = self._victim()
            self._preempt(victim)
            if victim is seq:
                return False
        self.blocks.append(seq.seq_id, seq.tokens[-missing:])
        return True

    def _victim(self) -> Sequence:
        """Who gives back its blocks under pressure: a sequence that has streamed nothing yet,
        the one holding the most blocks (a long prompt mid-prefill), before any streaming
        one; among streaming ones, the most recently admitted. So a hog waits; the sequences
        already answering keep going. That rule applies within the lowest priority class
        present (largest ``priority`` number): a batch sequence yields before an interactive one."""
        lowest = max(seq.priority for seq in self.running)
        pool = [seq for seq in self.running if seq.priority == lowest]
        quiet = [seq for seq in pool if not seq.run.produced]
        if quiet:
            return max(quiet, key=lambda seq: (self.blocks.num_tokens(seq.seq_id), self.running.index(seq)))
        return pool[-1]

    def _unblock(self) -> None:
        """Nothing could run: every running sequence is a prompt waiting for blocks that the
        others hold. The most recently admitted gives its blocks back (the oldest then fits:
        the web only accepts what fits the pool alone); a lone sequence that can never fit
        fails instead."""
        seq = self.running[-1]
        if len(self.running) == 1 and not self._fits_alone(seq):
            self._finish(seq, error=KVPoolExhausted(
                f"{len(seq.tokens)} tokens need {self.blocks.blocks_needed(len(seq.tokens))}"
                f" blocks; the pool has {self.blocks.num_blocks}"))
            return
        self._preempt(seq)

    def _preempt(self, seq: Sequence) -> None:
        self.blocks.free(seq.seq_id)
        self.running.remove(seq)
        seq.num_computed, seq.status = 0, WAITING
        seq.preemptions += 1
        self.stats.preemptions += 1
        at = next((i for i, other in enumerate(self.waiting) if other.priority >= seq.priority),
                  len(self.waiting))
        self.waiting.insert(at, seq)   # first of its class: it resumes before later arrivals
        log_event(logger, "sequence_preempted", seq_id=seq.seq_id, tokens=len(seq.tokens))

    # ------------------------------------------------------------------ endings
    def _drop_cancelled(self) -> None:
        for seq in [*self.running, *self.waiting]:
            try:
                cancelled = seq.run.cancelled()
            except Exception as exc:  # noqa: BLE001 - a broken cancel check fails only this one
                self._finish(seq, error=exc)
                continue
            if cancelled:
                self._finish(seq)

    def _finish(self, seq: Sequence, error: BaseException | None = None) -> None:
        if seq.finished:
            return
        if seq.seq_id in self.blocks:
            self.blocks.free(seq.seq_id)
        if seq in self.running:
            self.running.remove(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)
        seq.error = error        # before FINISHED: a reader seeing FINISHED also sees the error
        seq.status = FINISHED
        self.stats.finished += 1
        self._ended.append(seq)

    def abort_all(self, error: BaseException) -> list[Sequence]:
        """Finish every sequence with ``error`` (the owner is shutting down); returns them."""
        for seq in [*self.running, *self.waiting]:
            self._finish(seq, error=error)
        return self._take_ended()


def pool_blocks(settings: Any, geometry: KVGeometry, dtype: Any) -> int:
    """``kv_memory_mb`` when set, else ``kv_num_blocks``."""
    if settings.kv_memory_mb > 0:
        return blocks_for_budget(settings.kv_memory_mb * 2**20, settings.kv_block_size, geometry, dtype)
    return settings.kv_num_blocks
