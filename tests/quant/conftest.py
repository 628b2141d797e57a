"""Tiny Qwen2 models for the quantization tests (sizes the int4 kernel accepts, mostly)."""
from __future__ import annotations

import pytest

from tests.tiny_model import make_tiny_model_dir


@pytest.fixture(scope="session")
def quant_model_dir(tmp_path_factory):
    """hidden 64, intermediate 128 (int4 groups of 32/64 divide every input size); the
    ~400-token vocabulary is not a multiple of 16, so lm_head exercises int4 padding."""
    return make_tiny_model_dir(tmp_path_factory.mktemp("tiny-quant"), intermediate_size=128)
