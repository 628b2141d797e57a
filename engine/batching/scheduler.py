"""Continuous batching over the paged KV cache: one batched forward per step.

Each :meth:`Scheduler.step`
1. drops cancelled sequences;
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
carry on untouched.  Not thread-safe by design: one thread (the engine loop,
:mod:`engine.loop`) owns a scheduler. The first :meth:`step` records that thread, and a step
from any other thread raises (cheap guard against reintroducing shared driving).
"""
from __future__ import annotations

import logging
import threading
from collections import deque
from dataclasses import dataclass

import torch

from core.logs import log_event
from engine.batching.sequence import FINISHED, RUNNING, WAITING, Sequence
from engine.paged.attention import SeqChunk, build_batch
from engine.paged.block_manager import BlockManager
from engine.paged.forward import PagedQwen2
from engine.paged.pool import KVBlockPool, KVPoolExhausted
from engine.speculative.paged import reserve_drafts, settle_drafts

logger = logging.getLogger("miniserve.engine.scheduler")


@dataclass
class StepStats:
    steps: int = 0
    tokens: int = 0            # tokens run through the forward
    sampled: int = 0           # tokens produced
    preemptions: int = 0
    last_batch_size: int = 0
    last_num_tokens: int = 0
    max_batch_size: int = 0
    finished: int = 0
    draft_tokens: int = 0      # speculative drafts verified
    accepted_draft_tokens: int = 0


@dataclass
class _PromptBudget:
    """The prompt tokens one step may still add: ``total`` (the step's token budget after its
    decodes), of which long prompts' chunks may take ``chunk`` while sequences decode, and
    prompts whose whole rest fits ``short`` take that rest at once from ``short``."""

    total: int
    chunk: int
    short: int

    @property
    def left(self) -> bool:
        return self.total > 0 and (self.chunk > 0 or self.short > 0)

    def grant(self, rest: int) -> int:
        if 0 < rest <= min(self.short, self.total):
            return rest
        return min(rest, self.chunk, self.total)

    def spend(self, rest: int, count: int) -> None:
        self.total -= count
        if 0 < rest <= self.short and count == rest:
            self.short -= count
        else:
            self.chunk = max(0, self.chunk - count)


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
    def step(self) -> int:
        """Advance every scheduled sequence by one forward; returns tokens computed (0: idle)."""
        self._check_owner()
        self._drop_cancelled()
        plan = self._schedule()
        if not plan:
            return 0
        try:
            logits = self._forward(plan)
        except Exception as exc:  # noqa: BLE001 - fail this step's sequences, keep serving
            log_event(logger, "batch_step_failed", error=type(exc).__name__, batch=len(plan))
            for seq, _ in plan:
                self._finish(seq, error=exc)
            return 0
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
        return num_tokens

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
                                  decode_only=decode_only)

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
        spare = sum(self._still_needs(seq) for seq, _ in plan)  # prompts never take a stream's blocks
        prompts = _PromptBudget(budget, self.prefill_while_decoding if plan else budget,  # streams wait for
                                self.short_prompt_tokens if plan else 0)                # this step
        for seq in self.running:                            # 2. prompts mid-prefill
            if not prompts.left:
                break
            granted = prompts.grant(seq.num_pending)
            if granted and not seq.is_decoding and all(seq is not p for p, _ in plan):
                count = self._grow(seq, granted, spare)
                if count:
                    plan.append((seq, count))
                    prompts.spend(seq.num_pending, count)
        while self.waiting and prompts.left and len(self.running) < self.max_batch:  # 3. admit
            seq = self.waiting[0]
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
        if seq.on_finish is not None:
            seq.on_finish(seq)

    def abort_all(self, error: BaseException) -> None:
        """Finish every sequence with ``error`` (the owner is shutting down)."""
        for seq in [*self.running, *self.waiting]:
            self._finish(seq, error=error)
