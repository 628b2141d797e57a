"""The ``official`` method: transformers' own ``generate``, the reference every method matches.

Streaming and cancellation ride on a :class:`~transformers.StoppingCriteria`: ``generate``
calls it right after appending each new token (before the next forward), so it sees every
token in order, on the calling thread, with no streamer thread or queue in between.
"""
from __future__ import annotations

from typing import Any

import torch
from transformers import GenerationConfig, StoppingCriteria, StoppingCriteriaList

from engine.run import GenerationRun
from engine.types import SamplingParams


class _RunCriteria(StoppingCriteria):
    """Hands each new token to the run; stops on a stop string, max tokens or cancellation."""

    def __init__(self, run: GenerationRun) -> None:
        self.run = run

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor, **kwargs: Any) -> torch.BoolTensor:
        stop = self.run.accept(int(input_ids[0, -1]))
        return torch.full((input_ids.shape[0],), stop, dtype=torch.bool, device=input_ids.device)


def generation_config_for(base: GenerationConfig, sampling: SamplingParams, repetition_penalty: float,
                          eos_ids: list[int]) -> GenerationConfig:
    """The model's generation config with this request's sampling settings written over it."""
    config = GenerationConfig.from_dict(base.to_dict())
    config.max_new_tokens = sampling.max_new_tokens
    config.repetition_penalty = repetition_penalty
    config.eos_token_id = eos_ids
    if config.pad_token_id is None:
        config.pad_token_id = eos_ids[0]
    if sampling.greedy:
        config.do_sample = False
        config.temperature, config.top_p, config.top_k = None, None, None
    else:
        config.do_sample = True
        config.temperature = sampling.temperature
        config.top_p = sampling.top_p
        config.top_k = sampling.top_k
    return config


def generate_official(model: Any, prompt_ids: list[int], run: GenerationRun, sampling: SamplingParams,
                      repetition_penalty: float) -> None:
    """Run ``generate`` and feed every token to ``run`` (which records text, timings, reason)."""
    if run.cancelled():
        return
    device = next(model.parameters()).device
    input_ids = torch.tensor([prompt_ids], dtype=torch.long, device=device)
    config = generation_config_for(model.generation_config, sampling, repetition_penalty,
                                   sorted(run.eos_ids))
    if not sampling.greedy and sampling.seed is not None:
        torch.manual_seed(sampling.seed)  # generate samples from the global generator
    with torch.inference_mode():
        model.generate(input_ids, attention_mask=torch.ones_like(input_ids), generation_config=config,
                       stopping_criteria=StoppingCriteriaList([_RunCriteria(run)]))
