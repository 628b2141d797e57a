"""Fixtures: the session's tiny model (fp32) and the real model for the bounded slow tests."""
from __future__ import annotations

import pytest

from tests.engine.conftest import _one_torch_thread, real_engine, real_engine_fp32, tiny_engine  # noqa: F401
from tests.tiny_model import tiny_model_dir  # noqa: F401  (fixture)


@pytest.fixture(scope="session")
def spec_engine(tiny_model_dir):  # noqa: F811
    """The tiny model with small paged blocks (drafts cross block boundaries often)."""
    from core.settings import load_settings
    from engine.engine import Engine

    return Engine(load_settings(model=str(tiny_model_dir), dtype="float32", device="cpu",
                                kv_block_size=4, kv_num_blocks=512, max_batch=8,
                                max_batched_tokens=64, spec_tokens=4, spec_ngram=(3, 2, 1)))
