"""Whether and how a request speculates: the worker's settings, switched per request."""
from __future__ import annotations

from typing import Any

from engine.quant import native
from engine.speculative.policy import SpecConfig


# One more verified row as a fraction of a one-row step, by how the forward multiplies. bf16
# (oneDNN) steps stay bound by reading the weights up to ~8 rows: ~5% per row. q8's integer
# kernel multiplies tiles of rows against tiles of weights (q8.c): its linears take 23.9 ms at
# 1 row, 25.5 at 4 and 41.1 at 8 with two-byte activations (results/quant_kernels_step.csv), so
# rows are nearly free up to 4 and then cost compute. Through the whole forward (400 tokens of
# context, a one-off timing under the lock) a verify step of 2, 5 and 9 rows took 26.4, 34.3
# and 51.5 ms: ~0.10 of a step per row beyond the first few.
#
# That holds for the AVX512-VNNI kernel. The AVX2 one (engine.quant.native.vector_path) widens
# each weight to 16 bits and multiplies it with two activation rows at a time, so every row
# costs compute: a timing of the verify forward on an AVX2 EPYC (results/avx2/verify_rows.json,
# a context of 400) measured 0.41-0.55 of a one-row step per extra row over 2-9 rows (0.35-0.61
# in three earlier runs); the portable C loop pays a row in full.
ROW_COST_BF16 = 0.05
ROW_COST_Q8 = 0.10
ROW_COST_Q8_AVX2 = 0.50
ROW_COST_Q8_BY_PATH = {"avx512-vnni": ROW_COST_Q8, "avx2": ROW_COST_Q8_AVX2, "portable": 1.0}


def row_cost(weights: Any) -> float:
    """The verify-row cost for a forward's weights (q8 when its lm_head runs our kernel, priced by
    the kernel's vector path on this CPU)."""
    if getattr(getattr(weights, "lm_head", None), "mode", None) not in ("q8", "q5"):
        return ROW_COST_BF16
    return ROW_COST_Q8_BY_PATH[native.vector_path()]


def spec_config(settings: Any, requested: bool | None, weights: Any = None) -> SpecConfig | None:
    """``requested`` is the request's ``speculative`` flag: True/False force it on/off,
    None follows ``MINISERVE_SPECULATIVE``. Returns None when the request does not draft.
    ``weights``: the forward's, to price a verified row (:func:`row_cost`)."""
    enabled = settings.speculative != "off" if requested is None else bool(requested)
    if not enabled:
        return None
    return SpecConfig(num_tokens=settings.spec_tokens, ngram_lengths=tuple(settings.spec_ngram),
                      row_cost=row_cost(weights))
