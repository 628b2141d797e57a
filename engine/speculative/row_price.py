"""A verified row's price measured on the engine's own forward, once per forward.

Why measure: the draft budget (engine/speculative/budget.py) prices each row a verify step
adds as a fraction of a one-row step, and that fraction is the CPU's, not the code's: the
same AVX512-VNNI kernel costs 0.10 of a step per extra row on the AMD EPYC where the fixed
prices were measured, 0.19-0.31 on an Intel Xeon (results/xeon/verify_rows.json); priced at
0.10 there, drafts the budget thinks pay for themselves do not. So with
``MINISERVE_SPEC_ROW_COST=measured`` the first speculative request of a forward times it as
``bench.verify_rows`` does (a scratch contiguous cache, a random context, one-row and
``ROWS``-row steps interleaved, medians) and keeps the price for the forward's life.

Runs on the engine loop's thread, the forward's owner (it is called where a request's
speculation is set up); it costs about a dozen forwards, once.
"""
from __future__ import annotations

import logging
import statistics
import time
import weakref
from typing import Any

import torch

CONTEXT = 128     # tokens of context the timed steps attend to
ROWS = 5          # the many-row step: a pending token and 4 drafts
REPEATS = 5       # interleaved pairs after one warm pair
FLOOR, CEILING = 0.02, 1.0

logger = logging.getLogger(__name__)
_measured: "weakref.WeakKeyDictionary[Any, float]" = weakref.WeakKeyDictionary()


def measured_row_cost(forward: Any) -> float:
    """This forward's price of one more verified row (measured on first use)."""
    price = _measured.get(forward)
    if price is None:
        price = _measured[forward] = _measure(forward)
    return price


def price_from(one_row_s: float, many_rows_s: float, rows: int = ROWS) -> float:
    """``(t(rows) / t(1) - 1) / (rows - 1)``, kept within [FLOOR, CEILING]."""
    return min(max((many_rows_s / one_row_s - 1.0) / (rows - 1), FLOOR), CEILING)


@torch.inference_mode()
def verify_step_times(forward: Any, context: int, rows: tuple[int, ...], rounds: int) -> dict[int, list[float]]:
    """Seconds per forward of each row count in ``rows`` over ``context`` random tokens of a
    scratch contiguous cache, ``rounds`` interleaved rounds (order alternating) after a warm
    one; the cache is cut back to the context after each step. On the forward's owner thread."""
    from engine.kv_cache import ContiguousKVCache
    from engine.quant import exact_attention

    weights = forward.weights
    cache = ContiguousKVCache(forward.config, context + max(rows), weights.dtype, weights.device,
                              exact=exact_attention(weights), fused=forward.fused_attention)
    generator = torch.Generator().manual_seed(0)
    vocab = forward.config.vocab_size
    forward(torch.randint(0, vocab, (context,), generator=generator), cache)
    times: dict[int, list[float]] = {n: [] for n in rows}
    for round_ in range(rounds + 1):                             # round 0 warms each shape
        for n in (rows if round_ % 2 == 0 else tuple(reversed(rows))):
            ids = torch.randint(0, vocab, (n,), generator=generator)
            start = time.perf_counter()
            forward(ids, cache, last_only=n == 1)
            elapsed = time.perf_counter() - start
            cache.truncate(context)
            if round_:
                times[n].append(elapsed)
    return times


def _measure(forward: Any) -> float:
    from core.logs import log_event

    times = verify_step_times(forward, CONTEXT, (1, ROWS), REPEATS)
    one, many = statistics.median(times[1]), statistics.median(times[ROWS])
    price = price_from(one, many)
    log_event(logger, "spec_row_cost_measured", row_cost=round(price, 3), one_row_ms=round(one * 1000, 2),
              rows=ROWS, many_rows_ms=round(many * 1000, 2))
    return price
