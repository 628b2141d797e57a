from tests.engine.conftest import real_engine  # noqa: F401  (fixture: the default model, loaded once)
