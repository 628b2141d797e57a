"""Scale-out tests reuse the integration fixtures (tiny model, redis, stack helpers)."""
from tests.integration.conftest import (  # noqa: F401 - fixtures, re-exported for this folder
    WORKER_ENV, redis_proc, stack, store, tiny_model,
)
