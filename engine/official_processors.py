"""The ``official`` method's own logits processors: OpenAI's penalties and bias, the
log-probability recorder, and the sampling warpers placed after them; :func:`processors`
builds the list ``generate`` gets.

``generate`` appends caller-supplied processors *after* its own, which include
temperature, top-k and top-p; so when sampling, those warpers are built here and put
last, and ``generate`` is told not to build its own. The order is then the hand-written
sampler's: repetition penalty, presence/frequency, bias, (log-probabilities), grammar mask,
end-of-sequence hold (``min_tokens``, ``ignore_eos``: :func:`engine.sampling.hold_eos`),
temperature, top-k, top-p, min-p.
"""
from __future__ import annotations

from typing import Any

import torch
from transformers import (LogitsProcessor, LogitsProcessorList, MinPLogitsWarper, TemperatureLogitsWarper,
                          TopKLogitsWarper, TopPLogitsWarper)

from engine.constrained.processor import GrammarLogitsProcessor
from engine.logprobs import LogprobRecorder
from engine.penalties import check_bias, penalize_counts
from engine.sampling import hold_eos, position_seed, safe_temperature
from engine.types import SamplingParams

NEUTRAL_WARPERS = {"temperature": 1.0, "top_k": 0, "top_p": 1.0}  # generate builds none of its own


class OpenAIPenaltyProcessor(LogitsProcessor):
    """Presence/frequency over the generated ids (``input_ids[:, prompt_len:]``), then the bias."""

    def __init__(self, sampling: SamplingParams, prompt_len: int, vocab_size: int) -> None:
        check_bias(sampling.logit_bias, vocab_size)
        self.sampling = sampling
        self.prompt_len = prompt_len
        self.vocab_size = vocab_size

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        s = self.sampling
        scores = scores.to(torch.float32).clone()
        for row in range(scores.shape[0]):
            ids, hits = torch.unique(input_ids[row, self.prompt_len:], return_counts=True)
            penalize_counts(scores[row], ids, hits.to(torch.float32), s.presence_penalty, s.frequency_penalty)
            for token_id, value in s.logit_bias:
                scores[row, int(token_id)] += float(value)
        return scores


class LogprobProcessor(LogitsProcessor):
    """Scores the distribution at its place in the list; the run's criteria takes the token."""

    def __init__(self, recorder: LogprobRecorder) -> None:
        self.recorder = recorder

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        self.recorder.score(scores[0])
        return scores


class EosHoldProcessor(LogitsProcessor):
    """End-of-sequence at -inf while fewer than ``min_tokens`` were generated (always with
    ``ignore_eos``), as the hand-written sampler holds it."""

    def __init__(self, sampling: SamplingParams, prompt_len: int, eos_ids: list[int], constrained: bool) -> None:
        self.sampling = sampling
        self.prompt_len = prompt_len
        self.eos_ids = torch.tensor(sorted(eos_ids), dtype=torch.long)
        self.constrained = constrained

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        generated = input_ids.shape[-1] - self.prompt_len
        if not self.sampling.ignore_eos and generated >= self.sampling.min_tokens:
            return scores
        return hold_eos(scores.clone(), self.eos_ids.to(scores.device), keep_if_alone=self.constrained)


class PositionSeedProcessor(LogitsProcessor):
    """Seeds the global generator, which ``generate`` samples from, for the token it is about
    to draw, as the hand-written sampler seeds its own (:func:`engine.sampling.position_seed`).
    Last in the list: nothing draws between it and the sample."""

    def __init__(self, seed: int, prompt_len: int) -> None:
        self.seed, self.prompt_len = seed, prompt_len

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        torch.manual_seed(position_seed(self.seed, input_ids.shape[-1] - self.prompt_len))
        return scores


def warpers(sampling: SamplingParams) -> list[Any]:
    """Temperature, top-k, top-p, min-p as ``generate`` would build them, for placing last."""
    out: list[Any] = []
    temperature = safe_temperature(sampling.temperature)
    if temperature != 1.0:
        out.append(TemperatureLogitsWarper(temperature))
    if sampling.top_k > 0:
        out.append(TopKLogitsWarper(sampling.top_k))
    if sampling.top_p < 1.0:
        out.append(TopPLogitsWarper(sampling.top_p))
    if sampling.min_p > 0.0:
        out.append(MinPLogitsWarper(sampling.min_p))
    return out


def processors(sampling: SamplingParams, prompt_len: int, vocab_size: int, constraint: Any,
               recorder: LogprobRecorder | None, eos_ids: list[int]) -> LogitsProcessorList:
    """Everything after ``generate``'s repetition penalty, in the hand-written sampler's order."""
    out: list[Any] = []
    if sampling.presence_penalty or sampling.frequency_penalty or sampling.logit_bias:
        out.append(OpenAIPenaltyProcessor(sampling, prompt_len, vocab_size))
    if recorder is not None:
        out.append(LogprobProcessor(recorder))
    if constraint is not None:
        out.append(GrammarLogitsProcessor(constraint, prompt_len))
    if (sampling.ignore_eos or sampling.min_tokens > 0) and eos_ids:
        out.append(EosHoldProcessor(sampling, prompt_len, eos_ids, constrained=constraint is not None))
    if not sampling.greedy:
        out.extend(warpers(sampling))
        if sampling.seed is not None:
            out.append(PositionSeedProcessor(sampling.seed, prompt_len))
    return LogitsProcessorList(out)
