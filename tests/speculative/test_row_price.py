"""MINISERVE_SPEC_ROW_COST=measured: a verified row priced by timing the engine's own forward."""
from types import SimpleNamespace

import pytest

from engine.handwritten import forward_for
from engine.speculative import row_price
from engine.speculative.config import row_cost, spec_config


def test_price_is_the_extra_time_per_row_within_bounds():
    assert row_price.price_from(0.020, 0.030, rows=5) == pytest.approx(0.125)
    assert row_price.price_from(0.020, 0.019, rows=5) == row_price.FLOOR      # noise below a row's cost
    assert row_price.price_from(0.020, 0.500, rows=5) == row_price.CEILING


def test_measured_once_per_forward_on_its_owner_thread(spec_engine, monkeypatch):
    calls = []
    measure = row_price._measure
    monkeypatch.setattr(row_price, "_measure", lambda forward: calls.append(forward) or measure(forward))
    forward = spec_engine.loop.call(lambda: forward_for(spec_engine))
    first = spec_engine.loop.call(lambda: row_price.measured_row_cost(forward))
    again = spec_engine.loop.call(lambda: row_price.measured_row_cost(forward))
    assert first == again and row_price.FLOOR <= first <= row_price.CEILING and len(calls) <= 1


def test_settings_choose_the_fixed_or_the_measured_price(spec_engine, monkeypatch):
    monkeypatch.setattr(row_price, "measured_row_cost", lambda forward: 0.42)
    forward = spec_engine.loop.call(lambda: forward_for(spec_engine))
    fixed = SimpleNamespace(speculative="ngram", spec_tokens=8, spec_ngram=(4, 3, 2), spec_row_cost="fixed")
    measured = SimpleNamespace(**{**vars(fixed), "spec_row_cost": "measured"})
    assert spec_config(fixed, None, forward.weights, forward).row_cost == row_cost(forward.weights)
    assert spec_config(measured, None, forward.weights, forward).row_cost == 0.42
    assert spec_config(measured, None, forward.weights).row_cost == row_cost(forward.weights)  # no forward


def test_a_bad_setting_is_refused_naming_the_variable(monkeypatch):
    from core.settings import load_settings

    monkeypatch.setenv("MINISERVE_SPEC_ROW_COST", "sometimes")
    with pytest.raises(Exception, match="(?i)spec_row_cost"):
        load_settings()
