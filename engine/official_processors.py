"""The ``official`` method's own logits processors: OpenAI's penalties and bias, the
log-probability recorder, and the sampling warpers placed after them; :func:`processors`
builds the list ``generate`` gets.

``generate`` appends caller-supplied processors *after* its own, which include
temperature, top-k and top-p; so when sampling, those warpers are built here and put
last, and ``generate`` is told not to build its own. The order is then the hand-written
sampler's: repetition penalty, presence/frequency, bias, (log-probabilities), grammar mask,
temperature, top-k, top-p.
"""
from __future__ import annotations

from typing import Any

import torch
from transformers import (LogitsProcessor, LogitsProcessorList, TemperatureLogitsWarper, TopKLogitsWarper,
                          TopPLogitsWarper)

from engine.constrained.processor import GrammarLogitsProcessor
from engine.logprobs import LogprobRecorder
from engine.penalties import check_bias, penalize_counts
from engine.sampling import safe_temperature
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


def warpers(sampling: SamplingParams) -> list[Any]:
    """Temperature, top-k, top-p as ``generate`` would build them, for placing last."""
    out: list[Any] = []
    temperature = safe_temperature(sampling.temperature)
    if temperature != 1.0:
        out.append(TemperatureLogitsWarper(temperature))
    if sampling.top_k > 0:
        out.append(TopKLogitsWarper(sampling.top_k))
    if sampling.top_p < 1.0:
        out.append(TopPLogitsWarper(sampling.top_p))
    return out


def processors(sampling: SamplingParams, prompt_len: int, vocab_size: int, constraint: Any,
               recorder: LogprobRecorder | None) -> LogitsProcessorList:
    """Everything after ``generate``'s repetition penalty, in the hand-written sampler's order."""
    out: list[Any] = []
    if sampling.presence_penalty or sampling.frequency_penalty or sampling.logit_bias:
        out.append(OpenAIPenaltyProcessor(sampling, prompt_len, vocab_size))
    if recorder is not None:
        out.append(LogprobProcessor(recorder))
    if constraint is not None:
        out.append(GrammarLogitsProcessor(constraint, prompt_len))
    if not sampling.greedy:
        out.extend(warpers(sampling))
    return LogitsProcessorList(out)
