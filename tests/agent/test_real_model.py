"""One bounded agent run on the real default model as CPU workers serve it by default (q8; greedy,
so deterministic)."""
from __future__ import annotations

import pytest

from agent import AgentRunner, EngineChatModel
from tools import create_default_registry

pytestmark = pytest.mark.slow


def test_calculator_case_end_to_end(real_engine_q8):
    model = EngineChatModel(real_engine_q8, method="custom_cache")
    result = AgentRunner(model, create_default_registry(), max_new_tokens=64).run(
        "请计算 (125 * 8) - 37，并说明结果。", max_steps=2)
    assert result.ok, result.to_dict()
    step = result.trace[0]
    assert step.tool_name == "calculator" and step.result == "963" and step.success
    assert "963" in result.text
    assert result.model_calls <= 3
