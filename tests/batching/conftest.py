"""The paged tests' fixtures: a small-block paged engine on the tiny model, the real model in float32."""
from tests.engine.conftest import real_engine_fp32  # noqa: F401  (fixture)
from tests.paged.conftest import paged_engine, tiny_model_dir  # noqa: F401  (fixtures)
