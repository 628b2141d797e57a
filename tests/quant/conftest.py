"""Tiny Qwen2 models for the quantization tests."""
from __future__ import annotations

import pytest

from tests.tiny_model import make_tiny_model_dir


@pytest.fixture(scope="session")
def quant_model_dir(tmp_path_factory):
    """hidden 64, intermediate 128: every input size a multiple of q8's group of 32."""
    return make_tiny_model_dir(tmp_path_factory.mktemp("tiny-quant"), intermediate_size=128)
