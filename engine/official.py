"""The ``official`` method: transformers' own ``generate``, the reference every method matches.

Streaming and cancellation ride on a :class:`~transformers.StoppingCriteria`: ``generate``
calls it right after appending each new token (before the next forward), so it sees every
token in order, on the calling thread, with no streamer thread or queue in between.
"""
from __future__ import annotations

from typing import Any

import torch
from transformers import StoppingCriteria, StoppingCriteriaList

from engine.logprobs import LogprobRecorder
from engine.official_processors import NEUTRAL_WARPERS, processors
from engine.run import GenerationRun
from engine.sampling import safe_penalty
from engine.types import SamplingParams


class _RunCriteria(StoppingCriteria):
    """Hands each new token to the run; stops on a stop string, max tokens or cancellation."""

    def __init__(self, run: GenerationRun, recorder: LogprobRecorder | None = None) -> None:
        self.run = run
        self.recorder = recorder

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor, **kwargs: Any) -> torch.BoolTensor:
        token = int(input_ids[0, -1])
        if self.recorder is not None:
            self.recorder.take(token)
        stop = self.run.accept(token)
        return torch.full((input_ids.shape[0],), stop, dtype=torch.bool, device=input_ids.device)


def generate_kwargs(sampling: SamplingParams, repetition_penalty: float, eos_ids: list[int],
                    pad_id: int | None) -> dict[str, Any]:
    """This request's settings as ``generate`` keyword arguments; everything else (and anything
    not passed) comes from the model's own generation config, as with a plain ``generate``."""
    kwargs: dict[str, Any] = {"max_new_tokens": sampling.max_new_tokens,
                              "repetition_penalty": safe_penalty(repetition_penalty),
                              "eos_token_id": eos_ids, "pad_token_id": eos_ids[0] if pad_id is None else pad_id}
    if sampling.greedy:
        kwargs["do_sample"] = False
    else:
        kwargs.update(do_sample=True, **NEUTRAL_WARPERS)  # ours come last (official_processors)
    return kwargs


def generate_official(model: Any, prompt_ids: list[int], run: GenerationRun, sampling: SamplingParams,
                      repetition_penalty: float, constraint: Any = None) -> None:
    """Run ``generate`` and feed every token to ``run`` (which records text, timings, reason)."""
    if run.cancelled():
        return
    device = next(model.parameters()).device
    input_ids = torch.tensor([prompt_ids], dtype=torch.long, device=device)
    kwargs = generate_kwargs(sampling, repetition_penalty, sorted(run.eos_ids), model.generation_config.pad_token_id)
    recorder = LogprobRecorder(run.logprobs, sampling.top_logprobs) if run.logprobs is not None else None
    kwargs["logits_processor"] = processors(sampling, len(prompt_ids), model.config.vocab_size, constraint, recorder,
                                            sorted(run.eos_ids))
    with torch.inference_mode():
        model.generate(input_ids, attention_mask=torch.ones_like(input_ids),
                       stopping_criteria=StoppingCriteriaList([_RunCriteria(run, recorder)]), **kwargs)
