"""The table of generation methods an :class:`~engine.engine.Engine` offers by default.

Each runner has the signature ``runner(engine, prompt, run, request, repetition_penalty) ->
cached_tokens``: it produces tokens into ``run`` until ``run.accept`` says stop.
"""
from __future__ import annotations

from typing import Any

from engine.prompt import Prompt
from engine.run import GenerationRun
from engine.types import GenerationRequest


def run_official(engine: Any, prompt: Prompt, run: GenerationRun, request: GenerationRequest,
                 penalty: float) -> int:
    from engine.official import generate_official

    generate_official(engine.loaded.model, prompt.ids, run, request.sampling, penalty)
    return 0


def run_paged(engine: Any, prompt: Prompt, run: GenerationRun, request: GenerationRequest,
              penalty: float) -> int:
    from engine.batching.service import run_paged as paged

    return paged(engine, prompt, run, request, penalty)


def builtin_methods() -> dict[str, Any]:
    from engine.handwritten import handwritten_methods

    return {"official": run_official, **handwritten_methods(), "paged": run_paged}
