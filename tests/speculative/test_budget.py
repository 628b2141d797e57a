"""Sharing a step's drafts by expected value (engine.speculative.budget)."""
from __future__ import annotations

import pytest

from engine.speculative.budget import choose_drafts
from engine.speculative.policy import SpecConfig

CONFIG = SpecConfig(row_cost=0.04, min_chance=0.1)


def _geometric(rate: float, k: int = 8) -> list[float]:
    return [rate ** i for i in range(1, k + 1)]


def test_batch_one_drafts_every_likely_token():
    # alone, a row costs 4% of the step: a draft pays when its chance beats ~4% of the tokens
    assert choose_drafts([_geometric(0.9)], 1, CONFIG, room=16) == [8]
    assert choose_drafts([_geometric(0.5)], 1, CONFIG, room=16) == [3]   # 0.5 0.25 0.125; 0.0625 < min
    assert choose_drafts([_geometric(0.05)], 1, CONFIG, room=16) == [0]


def test_batch_of_eight_drafts_only_where_acceptance_is_high():
    chances = [_geometric(0.95)] * 2 + [_geometric(0.3)] * 6
    counts = choose_drafts(chances, 8, CONFIG, room=64)
    assert counts[2:] == [0] * 6                  # 0.3 does not pay for a row among 8 sequences
    assert all(c >= 5 for c in counts[:2])        # copying sequences keep long drafts
    # the same sequence alone drafts more than inside the batch
    assert choose_drafts([_geometric(0.6)], 1, CONFIG, room=16)[0] > choose_drafts(
        [_geometric(0.6)] + [[]] * 7, 8, CONFIG, room=64)[0]


def test_room_and_empty_proposals():
    assert choose_drafts([_geometric(0.99)] * 3, 3, CONFIG, room=4) == [2, 1, 1] or \
        sum(choose_drafts([_geometric(0.99)] * 3, 3, CONFIG, room=4)) == 4
    assert choose_drafts([[], []], 2, CONFIG, room=8) == [0, 0]
    assert choose_drafts([_geometric(0.99)], 1, CONFIG, room=0) == [0]


def test_the_chosen_drafts_raise_expected_tokens_per_cost():
    chances = [_geometric(r) for r in (0.9, 0.7, 0.5, 0.35, 0.2, 0.1, 0.8, 0.6)]
    counts = choose_drafts(chances, 8, CONFIG, room=64)

    def rate(cs):
        tokens = 8 + sum(sum(c[:n]) for c, n in zip(chances, cs))
        return tokens / (1 + CONFIG.row_cost * (8 - 1 + sum(cs)))

    best = rate(counts)
    for index in range(8):                        # one draft more or less anywhere is no better
        for delta in (-1, 1):
            other = list(counts)
            other[index] += delta
            if 0 <= other[index] <= 8:
                assert rate(other) <= best + 1e-9


@pytest.mark.parametrize("path", ["avx512-vnni", "avx2", "portable"])
def test_a_q8_forward_prices_verify_rows_higher(monkeypatch, path):
    """q8's integer kernel is compute-bound after a few rows (the AVX2 one from the second, the
    portable loop at once): its verify rows cost more, so the same chances buy fewer drafts
    than in bf16."""
    from types import SimpleNamespace

    from engine.quant import native
    from engine.speculative.config import (ROW_COST_BF16, ROW_COST_Q8, ROW_COST_Q8_AVX2, row_cost,
                                           spec_config)

    monkeypatch.setattr(native, "vector_path", lambda: path)
    price = {"avx512-vnni": ROW_COST_Q8, "avx2": ROW_COST_Q8_AVX2, "portable": 1.0}[path]
    q8 = SimpleNamespace(lm_head=SimpleNamespace(mode="q5"))
    assert row_cost(q8) == price > ROW_COST_BF16 == row_cost(SimpleNamespace(lm_head=object())) == row_cost(None)
    settings = SimpleNamespace(speculative="ngram", spec_tokens=8, spec_ngram=(4, 3, 2))
    cheap, dear = spec_config(settings, None), spec_config(settings, None, q8)
    chances = [[0.8 ** i for i in range(1, 9)]]
    assert sum(choose_drafts(chances, 1, dear, 8)) < sum(choose_drafts(chances, 1, cheap, 8))
