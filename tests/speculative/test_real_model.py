"""Bounded checks on the real default model in float32 (quant none): speculative greedy
output equals speculation off token for token, and drafts are accepted on a copy task."""
from __future__ import annotations

import pytest

from engine.types import GenerationRequest, SamplingParams

pytestmark = pytest.mark.slow

CODE = ("Rename the function area to circle_area. Reply with the code only.\n\n```python\n"
        "def area(r):\n    return 3.14159 * r * r\n\n\ndef ring(outer, inner):\n"
        "    return area(outer) - area(inner)\n```")


def _run(engine, method, speculative, tokens):
    return engine.generate(GenerationRequest(
        messages=[{"role": "user", "content": CODE}], method=method, speculative=speculative,
        sampling=SamplingParams(max_new_tokens=tokens)))


def test_custom_cache_greedy_identical_and_drafts_accepted(real_engine_fp32):
    off, on = _run(real_engine_fp32, "custom_cache", False, 40), _run(real_engine_fp32, "custom_cache", True, 40)
    assert on.token_ids == off.token_ids and on.text == off.text
    assert "circle_area" in on.text
    assert on.usage.accepted_draft_tokens >= 10


def test_paged_greedy_identical(real_engine_fp32):
    """Through the engine loop's paged scheduler, as a worker runs it."""
    off, on = _run(real_engine_fp32, "paged", False, 32), _run(real_engine_fp32, "paged", True, 32)
    assert on.token_ids == off.token_ids
    assert on.usage.accepted_draft_tokens > 0
