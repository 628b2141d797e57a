"""Tokens per minute per key (core/token_rate.py, fakeredis, explicit clock): charges add up
to the limit and no further, keys are apart, and the previous minute counts for the part of
it still inside the last 60 s."""
from __future__ import annotations

import fakeredis

from core.token_rate import TokenRate

T0 = 1_800_000_000.0 - 1_800_000_000.0 % 60  # the start of a minute


def rate(limit: int = 100) -> TokenRate:
    return TokenRate(fakeredis.FakeRedis(decode_responses=True), limit)


def test_charges_add_up_to_the_limit_and_the_next_waits_for_the_minute():
    tpm = rate()
    assert [tpm.charge("a", 40, T0 + 10).admitted for _ in range(3)] == [True, True, False]
    refused = tpm.charge("a", 40, T0 + 10)
    assert refused.used == 80 and refused.retry_after_s == 50
    assert tpm.charge("a", 20, T0 + 10).admitted  # what is left still fits
    assert tpm.charge("b", 100, T0 + 10).admitted  # another key has its own budget


def test_the_previous_minute_weighs_what_is_left_of_it_in_the_window():
    tpm = rate()
    assert tpm.charge("a", 100, T0 + 59).admitted
    assert not tpm.charge("a", 40, T0 + 60 + 15).admitted  # 100 x 0.75 = 75 still counted
    assert tpm.charge("a", 40, T0 + 60 + 45).admitted      # 100 x 0.25 = 25: 65 with this one
    assert not tpm.charge("a", 40, T0 + 60 + 45).admitted  # 105 would be over
