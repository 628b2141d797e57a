"""Choosing the next token for the hand-written methods, the way ``generate`` does.

Order (as transformers' logits processors): repetition penalty over prompt + generated ids,
then, when sampling, temperature, top-k, top-p, min-p; greedy is ``argmax`` of the penalized logits.
The penalty keeps a boolean "seen" mask over the vocabulary; each step gathers the scores of
the seen ids only, penalizes them and scatters them back (a few hundred values instead of five
passes over 151,936), with the values of ``RepetitionPenaltyLogitsProcessor``:
``score < 0 ? score * p : score / p`` for every id that occurred.

On the CPU the whole-vocabulary passes (the copy, finding the seen ids, greedy ``argmax``)
run in numpy, single-threaded: torch's ``argmax`` over 151,936 floats takes ~150 us where
numpy's takes ~15 us, and torch's intra-op threads wait on each other when the cores are
busy (see :mod:`engine.constrained.bitmask`). The results are the same bits: the
penalized values come from the same torch arithmetic, and both ``argmax`` return the first
maximal index.

End-of-sequence is held back (its ids' scores set to -inf, as llama.cpp does for
``ignore_eos`` and vLLM for ``min_tokens``) while fewer than ``min_tokens`` tokens were
generated, or for the whole answer with ``ignore_eos``; right after the grammar mask, and not
when the grammar allows nothing else (a finished structured answer still ends).

Each request samples from its own ``torch.Generator``. With a ``seed``, the generator is
seeded afresh for every position from (seed, position) (:func:`position_seed`), so a seed
reproduces a sample regardless of what else the process did, and an answer continued by a
later attempt from its n-th token (``resumed``) draws exactly what an uninterrupted run would.

Robust to extreme values: ``temperature`` and ``repetition_penalty`` are clamped to at least
:data:`MIN_TEMPERATURE` / :data:`MIN_PENALTY` (the web accepts only ``>= 0.01`` anyway, see
docs/api.md), and scores that still overflow fall back to the greedy choice, so sampling
never hands ``torch.multinomial`` an inf or NaN.

OpenAI's presence/frequency penalties and ``logit_bias`` (:mod:`engine.penalties`) follow
the repetition penalty; log-probabilities, when asked (``record``), are taken right after
them (:mod:`engine.logprobs`).

Constrained decoding: a request with a grammar hands its sampler a per-sequence
``constraint`` (:class:`engine.constrained.TokenConstraint`); its mask applies right after
the penalty and before temperature/top-k/top-p (so those only ever choose among allowed
tokens), and every chosen token is fed back to it. Each sequence of a batch has its own
sampler, so constrained and free sequences share one batched forward.
"""
from __future__ import annotations

from typing import Protocol, Sequence

import numpy as np
import torch

from engine.logprobs import LogprobRecorder
from engine.penalties import OpenAIPenalties
from engine.types import SamplingParams

# Below these, float32 logits divided by the value overflow; the choice is greedy by then anyway.
MIN_TEMPERATURE = 1e-4
MIN_PENALTY = 1e-4


def safe_temperature(temperature: float) -> float:
    return max(float(temperature), MIN_TEMPERATURE)


def safe_penalty(penalty: float) -> float:
    return max(float(penalty), MIN_PENALTY)


def apply_repetition_penalty(logits: torch.Tensor, seen: torch.Tensor, penalty: float) -> torch.Tensor:
    """``logits [..., vocab]`` float32; ``seen`` bool of the same last size."""
    if penalty == 1.0:
        return logits
    penalized = torch.where(logits < 0, logits * penalty, logits / penalty)
    return torch.where(seen, penalized, logits)


def penalize_seen(scores: torch.Tensor, seen: torch.Tensor, penalty: float) -> torch.Tensor:
    """:func:`apply_repetition_penalty` on a float32 ``scores [vocab]`` *in place*, touching only
    the ids ``seen`` marks (gather, penalize, scatter)."""
    if penalty == 1.0:
        return scores
    if scores.device.type == "cpu":
        ids = torch.from_numpy(np.flatnonzero(seen.numpy()))
    else:
        ids = seen.nonzero().squeeze(1)
    values = scores[ids]
    scores[ids] = torch.where(values < 0, values * penalty, values / penalty)
    return scores


def float_copy(logits: torch.Tensor) -> torch.Tensor:
    """``logits`` as a new float32 tensor (numpy's single-threaded copy on the CPU)."""
    if logits.device.type == "cpu" and logits.dtype == torch.float32:
        return torch.from_numpy(logits.detach().numpy().copy())
    return logits.to(torch.float32, copy=True)


def argmax(scores: torch.Tensor) -> int:
    """Index of the first maximal score of a 1-d tensor."""
    if scores.device.type == "cpu" and scores.dtype == torch.float32:
        return int(scores.numpy().argmax())
    return int(torch.argmax(scores))


def top_k_mask(logits: torch.Tensor, k: int) -> torch.Tensor:
    """Logits with everything below the k-th largest set to -inf (ties kept, as transformers)."""
    if k <= 0 or k >= logits.shape[-1]:
        return logits
    kth = torch.topk(logits, k)[0][..., -1, None]
    return logits.masked_fill(logits < kth, float("-inf"))


def min_p_mask(logits: torch.Tensor, min_p: float) -> torch.Tensor:
    """Drop the tokens whose probability is below ``min_p`` times the top token's (vLLM's and
    llama.cpp's min-p, computed as transformers' ``MinPLogitsWarper``); 0 keeps everything."""
    if min_p <= 0.0:
        return logits
    probs = torch.softmax(logits, dim=-1)
    threshold = min_p * probs.amax(dim=-1, keepdim=True)
    return logits.masked_fill(probs < threshold, float("-inf"))


def hold_eos(scores: torch.Tensor, eos_ids: torch.Tensor, keep_if_alone: bool) -> torch.Tensor:
    """``scores [..., vocab]`` with the end-of-sequence ids at -inf (in place); with
    ``keep_if_alone``, rows where nothing else is allowed (a grammar that can only end) keep them."""
    before = scores.index_select(-1, eos_ids)
    scores.index_fill_(-1, eos_ids, float("-inf"))
    if keep_if_alone:
        alone = ~torch.isfinite(scores).any(dim=-1, keepdim=True)
        if bool(alone.any()):
            scores.index_copy_(-1, eos_ids, torch.where(alone, before, scores.index_select(-1, eos_ids)))
    return scores


def top_p_mask(logits: torch.Tensor, p: float) -> torch.Tensor:
    """Keep the smallest set of most likely tokens whose probability reaches ``p`` (>= 1 token)."""
    if p >= 1.0:
        return logits
    sorted_logits, sorted_indices = torch.sort(logits, descending=False)
    cumulative = sorted_logits.softmax(dim=-1).cumsum(dim=-1)
    remove_sorted = cumulative <= (1 - p)
    remove_sorted[..., -1:] = False
    remove = remove_sorted.scatter(-1, sorted_indices, remove_sorted)
    return logits.masked_fill(remove, float("-inf"))


class LogitsConstraint(Protocol):
    """What the sampler needs from a grammar (see :mod:`engine.constrained.matcher`)."""

    def mask(self, logits: torch.Tensor) -> torch.Tensor: ...
    def accept(self, token: int) -> None: ...


def constrain(scores: torch.Tensor, constraint: LogitsConstraint | None) -> torch.Tensor:
    """The mask hook: ``scores`` with the grammar's forbidden tokens at -inf (or unchanged)."""
    return scores if constraint is None else constraint.mask(scores)


def position_seed(seed: int, position: int) -> int:
    """The generator seed for the ``position``-th generated token of a seeded request (a
    splitmix64 step: nearby seeds and positions give unrelated streams)."""
    z = (seed * 0x9E3779B97F4A7C15 + (position + 1) * 0xBF58476D1CE4E5B9) & 0xFFFFFFFFFFFFFFFF
    z = ((z ^ (z >> 30)) * 0x94D049BB133111EB) & 0xFFFFFFFFFFFFFFFF
    return (z ^ (z >> 31)) & 0x7FFFFFFFFFFFFFFF


class Sampler:
    """Per-request token chooser; call :meth:`observe` with every generated id (the prompt's
    come with the constructor)."""

    def __init__(self, params: SamplingParams, repetition_penalty: float, vocab_size: int,
                 prompt_ids: Sequence[int], device: torch.device | str = "cpu",
                 constraint: LogitsConstraint | None = None,
                 record: list[dict] | None = None, eos_ids: Sequence[int] = (),
                 resumed: Sequence[int] = ()) -> None:
        self.params = params
        self.constraint = constraint
        self.generated = 0  # tokens observed since the prompt (min_tokens counts them)
        self.eos_ids = torch.tensor(sorted(eos_ids), dtype=torch.long, device=device) \
            if (params.ignore_eos or params.min_tokens > 0) and eos_ids else None
        penalties = OpenAIPenalties(params, vocab_size, device)
        self.openai = penalties if penalties.active else None
        self.recorder = LogprobRecorder(record, params.top_logprobs) if record is not None else None
        self.penalty = safe_penalty(repetition_penalty)
        self.seen = torch.zeros(vocab_size, dtype=torch.bool, device=device)
        if prompt_ids:
            self.seen[torch.tensor(list(prompt_ids), dtype=torch.long, device=device)] = True
        self.generator: torch.Generator | None = None
        if not params.greedy:
            self.generator = torch.Generator(device=device)
            if params.seed is None:
                self.generator.seed()
        for token_id in resumed:  # an earlier attempt's tokens (already among prompt_ids' seen ids)
            self._follow(token_id)

    def observe(self, token_id: int) -> None:
        self.seen[token_id] = True
        self._follow(token_id)
        if self.recorder is not None:
            self.recorder.take(token_id)

    def _follow(self, token_id: int) -> None:
        """What a generated token changes besides the seen mask and the recorded entries."""
        self.generated += 1
        if self.openai is not None:
            self.openai.observe(token_id)
        if self.constraint is not None:
            self.constraint.accept(token_id)

    def rng(self) -> torch.Generator | None:
        """The generator for the next token's draws (re-seeded for its position when seeded)."""
        if self.generator is not None and self.params.seed is not None:
            self.generator.manual_seed(position_seed(self.params.seed, self.generated))
        return self.generator

    def process(self, logits: torch.Tensor) -> torch.Tensor:
        """The final scores ``generate`` would sample from (float32, ``[vocab]``)."""
        scores = penalize_seen(float_copy(logits), self.seen, self.penalty)
        if self.openai is not None:
            scores = self.openai.apply(scores)
        if self.recorder is not None:
            self.recorder.score(scores)
        scores = constrain(scores, self.constraint)
        if self.eos_ids is not None and (self.params.ignore_eos or self.generated < self.params.min_tokens):
            scores = hold_eos(scores, self.eos_ids, keep_if_alone=self.constraint is not None)
        if self.params.greedy:
            return scores
        scores = scores / safe_temperature(self.params.temperature)
        scores = top_k_mask(scores, self.params.top_k)
        return min_p_mask(top_p_mask(scores, self.params.top_p), self.params.min_p)

    def __call__(self, logits: torch.Tensor) -> int:
        """Pick the next id from ``logits [vocab]`` and remember it."""
        scores = self.process(logits.reshape(-1))
        if self.params.greedy:
            token = argmax(scores)
        else:
            token = self._sample(scores)
        self.observe(token)
        return token

    def _sample(self, scores: torch.Tensor) -> int:
        """Draw from ``softmax(scores)``; greedy when the scores overflowed (inf/NaN)."""
        if bool(torch.isnan(scores).any()) or bool(torch.isposinf(scores).any()):
            finite = torch.nan_to_num(scores, nan=float("-inf"))
            return argmax(finite)
        probs = torch.softmax(scores, dim=-1)
        return int(torch.multinomial(probs, 1, generator=self.rng()))
