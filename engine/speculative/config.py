"""Whether and how a request speculates: the worker's settings, switched per request."""
from __future__ import annotations

from typing import Any

from engine.speculative.policy import SpecConfig


def spec_config(settings: Any, requested: bool | None) -> SpecConfig | None:
    """``requested`` is the request's ``speculative`` flag: True/False force it on/off,
    None follows ``MINISERVE_SPECULATIVE``. Returns None when the request does not draft."""
    enabled = settings.speculative != "off" if requested is None else bool(requested)
    if not enabled:
        return None
    return SpecConfig(num_tokens=settings.spec_tokens, ngram_lengths=tuple(settings.spec_ngram))
