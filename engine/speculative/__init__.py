"""Speculative decoding: prompt-lookup (n-gram) drafts verified in one forward.

* :mod:`engine.speculative.ngram` - the incremental n-gram index that proposes drafts.
* :mod:`engine.speculative.policy` - per-sequence state and the adaptive on/off rule.
* :mod:`engine.speculative.acceptance` - the acceptance rule (greedy and sampling).
* :mod:`engine.speculative.contiguous` - the decode loop over a contiguous KV cache.
* :mod:`engine.speculative.config` - settings + the per-request flag -> a config or None.
"""
from engine.speculative.acceptance import accept_drafts
from engine.speculative.config import spec_config
from engine.speculative.ngram import NgramDrafter
from engine.speculative.policy import SpecConfig, SpecState

__all__ = ["NgramDrafter", "SpecConfig", "SpecState", "accept_drafts", "spec_config"]
