"""The paged tests' fixtures: a small-block paged engine on the tiny model, the real model."""
from tests.paged.conftest import paged_engine, real_engine, tiny_model_dir  # noqa: F401  (fixtures)
