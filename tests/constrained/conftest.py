"""Constrained-decoding fixtures: the engine tests' tiny engine and the real model."""
from tests.engine.conftest import _one_torch_thread, real_engine_q8, tiny_engine  # noqa: F401  (fixtures)
from tests.tiny_model import tiny_model_dir  # noqa: F401  (fixture)
