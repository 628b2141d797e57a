"""The table of non-batched generation methods a :class:`~engine.model_engine.ModelEngine` offers.

Each runner has the signature ``runner(engine, prompt, run, request, repetition_penalty) ->
cached_tokens``: it produces tokens into ``run`` until ``run.accept`` says stop. The loop
runs each as a solo task, one token per turn (:mod:`engine.solo`); ``paged`` is not here:
it is the loop's own batched path.
"""
from __future__ import annotations

from typing import Any, Callable

from core.methods import OFFICIAL
from engine.constrained import run_constraint
from engine.handwritten import handwritten_methods
from engine.official import generate_official
from engine.prompt import Prompt
from engine.quant.restore import full_weights
from engine.run import GenerationRun
from engine.types import GenerationRequest


def run_official(engine: Any, prompt: Prompt, run: GenerationRun, request: GenerationRequest,
                 penalty: float) -> int:
    model = official_model(engine.loaded.model, run.pause)
    # read on a loader thread while the loop goes on, freed again after (engine/quant/restore.py)
    with full_weights(model, keep=engine.settings.official_keep_weights, wait=run.pause):
        generate_official(model, prompt.ids, run, request.sampling, penalty,
                          constraint=run_constraint(engine, run, request.constraint))
    return 0


def official_model(model: Any, wait: Callable[[], None]) -> Any:
    """The transformers model ``generate`` runs: the loaded one, or a GGUF run's, built on its
    first ``official`` job (engine.gguf_model)."""
    build = getattr(model, "transformers_model", None)
    return model if build is None else build(wait)


def builtin_methods() -> dict[str, Any]:
    return {OFFICIAL: run_official, **handwritten_methods()}
