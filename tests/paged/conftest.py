"""Fixtures: an Engine on the session's tiny model with a small-block paged pool (the real
model's paged checks live in tests/engine/test_real_model.py, on its float32 engine)."""
from __future__ import annotations

import pytest

from core.settings import load_settings
from tests.tiny_model import tiny_model_dir  # noqa: F401  (fixture)


@pytest.fixture(scope="session")
def paged_engine(tiny_model_dir):  # noqa: F811
    from engine.engine import Engine

    return Engine(load_settings(model=str(tiny_model_dir), dtype="float32", device="cpu", quant="none",
                                kv_block_size=4, kv_num_blocks=512, max_batch=8,
                                max_batched_tokens=64))
