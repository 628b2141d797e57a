from tests.engine.conftest import real_engine_q8  # noqa: F401  (fixture: the default model in q8, per module)
