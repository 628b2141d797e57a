"""Bounded checks on the real default model in float32 (quant none): speculative greedy
output equals speculation off token for token, and drafts are accepted on a copy task."""
from __future__ import annotations

import pytest

from engine.types import GenerationRequest, SamplingParams
from tests.speculative.test_paged import _drive, _seq, _service

pytestmark = pytest.mark.slow

CODE = ("Rename the function area to circle_area. Reply with the code only.\n\n```python\n"
        "def area(r):\n    return 3.14159 * r * r\n\n\ndef ring(outer, inner):\n"
        "    return area(outer) - area(inner)\n```")


@pytest.fixture(scope="module")
def real_fp32():
    from core.settings import load_settings
    from engine.engine import Engine

    return Engine(load_settings(model="default", device="cpu", dtype="float32", quant="none",
                                spec_tokens=4, spec_ngram=(3, 2))).load()


def test_custom_cache_greedy_identical_and_drafts_accepted(real_fp32):
    def run(speculative):
        return real_fp32.generate(GenerationRequest(
            messages=[{"role": "user", "content": CODE}], method="custom_cache", speculative=speculative,
            sampling=SamplingParams(max_new_tokens=40)))

    off, on = run(False), run(True)
    assert on.token_ids == off.token_ids and on.text == off.text
    assert "circle_area" in on.text
    assert on.usage.accepted_draft_tokens >= 10


def test_paged_greedy_identical(real_fp32):
    service = _service(real_fp32)
    (off, _), = _drive(service, [_seq(service, real_fp32, CODE, False, max_new_tokens=32)])[0]
    (on, _), = _drive(service, [_seq(service, real_fp32, CODE, True, max_new_tokens=32)])[0]
    assert on.token_ids == off.token_ids
    assert on.usage.accepted_draft_tokens > 0
