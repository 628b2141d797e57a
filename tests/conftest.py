"""Suite-wide hygiene: hand each test module's freed memory back to the OS.

Several modules load the real model (bf16, fp32, quantized); glibc keeps the freed pages of
their many per-layer tensors in the heap, so the single pytest process would hold them for
the rest of the suite. (The larger cause of the ~21 GB the suite once reached was engines
kept alive by their loop threads: real-model fixtures now ``close()`` their engines.)
"""
from __future__ import annotations

import ctypes
import gc
import os

import pytest

from tests.harness.served import served_model_dir, served_shared, served_surface  # noqa: F401  (once per process)


GREW_MB = 64  # a module whose run grew the process by less than this leaves nothing worth a full collection


def _rss_mb() -> float:
    try:
        with open("/proc/self/statm") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
    except (OSError, ValueError, IndexError):
        return float("inf")  # unknown: always collect


@pytest.fixture(scope="module", autouse=True)
def _release_memory_after_module():
    """Only after a module that grew the process: a full ``gc.collect()`` in a process that has
    run a few hundred tests takes about a second, and most modules (web, unit) allocate little,
    so collecting after each cost about a minute of ``make test-fast``."""
    before = _rss_mb()
    yield
    if _rss_mb() - before < GREW_MB:
        return
    gc.collect()
    try:  # glibc only (engine.packed.release_freed_memory does the same; importing it loads torch)
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError, TypeError):
        pass


# --- test tiers -------------------------------------------------------------------------------
# `make test-fast` runs `-m "not slow and not integration and not heavy"`. Rather than trusting
# every test to carry its marker, slow and integration follow the fixtures a test uses (directly
# or through other fixtures): nobody has to remember, and a new test on these fixtures lands in
# the right tier. heavy (kernel builds for other CPUs, real-shaped files) is marked by hand.
SERVER_FIXTURES = frozenset({
    "redis_proc",         # tests.integration.conftest: a redis-server (under every stack fixture)
    "restartable_redis",  # tests.reliability.conftest: a redis-server that is stopped and restarted
    "served_surface",     # tests.harness.served: stacks kept for the test process (a redis-server each)
    "served_shared",
})
REAL_MODEL_FIXTURES = frozenset({
    "real_engine",        # tests.engine.conftest: the default model in bf16
    "real_engine_fp32",   # the default model in float32
    "real_engine_q8",     # the default model in q8
})


def pytest_collection_modifyitems(config, items):
    for item in items:
        used = set(getattr(item, "fixturenames", ()))
        if used & SERVER_FIXTURES:
            item.add_marker(pytest.mark.integration)
        if used & REAL_MODEL_FIXTURES:
            item.add_marker(pytest.mark.slow)


SERVER_PROGRAMS = frozenset({"redis-server", "redis-sentinel", "celery", "gunicorn", "web", "flower"})


def _server_in(argv) -> str | None:
    """The server an argv starts (``redis-server ...``, ``python -m celery|web ...``), if any."""
    args = [str(a) for a in ([argv] if isinstance(argv, (str, bytes, os.PathLike)) else argv)]
    names = [os.path.basename(args[0])] if args else []
    names += [args[i + 1] for i, a in enumerate(args[:-1]) if a == "-m"]
    return next((n for n in names if n in SERVER_PROGRAMS), None)


_running: list = []   # the test item being set up, run or torn down


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    _running.append(item)
    yield
    _running.pop()


def _guard_popen() -> None:
    """A test without the ``integration`` marker cannot start a server, nor can the fixtures it
    sets up (module- and session-scoped too): the Popen fails loudly, so a forgotten marker
    shows at once instead of slowing ``make test-fast``."""
    import subprocess

    original = subprocess.Popen.__init__

    def guarded(self, args, *rest, **kwargs):
        item = _running[-1] if _running else None
        server = _server_in(args)
        if server and item is not None and not item.get_closest_marker("integration"):
            raise RuntimeError(f"{item.nodeid} starts {server} but is not marked integration")
        original(self, args, *rest, **kwargs)
    subprocess.Popen.__init__ = guarded


def pytest_configure(config):
    _guard_popen()
    _build_kernels_for_test_march()


def _build_kernels_for_test_march() -> None:
    """MINISERVE_TEST_MARCH=x86-64-v3 (AVX2), icelake-server or x86-64 (portable C) builds our
    C kernels for that CPU instead of ``-march=native``: with ATEN_CPU_CAPABILITY (torch's
    kernels) and ONEDNN_MAX_CPU_ISA (oneDNN's) this machine runs the tests as that CPU would
    (scripts/run_tests.sh --as avx2). Test-only: the library is keyed by its flags."""
    march = os.environ.get("MINISERVE_TEST_MARCH")
    if march:
        from engine.quant import native

        native.FLAGS = tuple(f for f in native.FLAGS if f != "-march=native") + (f"-march={march}",)
