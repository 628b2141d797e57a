"""Fixtures for engine tests: tiny models (fast) and the real default model (slow, once)."""
from __future__ import annotations

import pytest

from core.settings import load_settings
from tests.tiny_model import make_tiny_model_dir, tiny_model_dir  # noqa: F401  (fixture)


@pytest.fixture(scope="session")
def tiny_engine(tiny_model_dir):  # noqa: F811
    """An Engine on the session's tiny model, float32 so comparisons are tight."""
    from engine.engine import Engine

    # quant="none": the tests assert exact equality with official (full precision)
    return Engine(load_settings(model=str(tiny_model_dir), dtype="float32", device="cpu", quant="none"))


@pytest.fixture(scope="session")
def real_engine():
    """The bundled default model in bf16, loaded once per session (slow tests only)."""
    from engine.engine import Engine

    engine = Engine(load_settings(model="default", device="cpu", dtype="bfloat16", quant="none"))
    engine.loaded  # noqa: B018 - load now, outside the timed tests
    return engine


@pytest.fixture(scope="module")
def real_engine_q8():
    """The default model as a CPU worker serves it by default (``auto``: q8), per module. For
    tests of what runs on the model rather than of its rounding: on CPUs without bf16 GEMM
    kernels (AVX2) a bf16 ``none`` prompt multiplies one row at a time, several times slower."""
    from engine.engine import Engine

    engine = Engine(load_settings(model="default", device="cpu", dtype="bfloat16", quant="q8")).load()
    yield engine
    engine.close()


@pytest.fixture(scope="module")
def real_engine_fp32():
    """The default model in float32, per module (closed after it: 2 GB). Rounding differences
    between a whole-sequence pass, a cached step and a batch are ~1e-6 there, so every method
    must give official's exact tokens on every CPU, which bf16 does not promise."""
    from engine.engine import Engine

    engine = Engine(load_settings(model="default", device="cpu", dtype="float32", quant="none")).load()
    yield engine
    engine.close()  # the loop thread would keep the model alive for the rest of the suite


@pytest.fixture(autouse=True)
def _one_torch_thread(request):
    """Tiny-model tests run on one thread: on a shared 2-core machine, two OpenMP threads
    wait on each other for milliseconds per op, making tiny models 5-10x slower."""
    import torch

    if request.node.get_closest_marker("slow"):
        yield
        return
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
