"""engine.openmp: a thread can give its OpenMP worker threads back (one team per process)."""
from __future__ import annotations

import os
import threading

import pytest
import torch

from core.settings import load_settings
from engine.engine import Engine
from engine.openmp import release_thread_team
from tests.tiny_model import tiny_model_dir  # noqa: F401  (fixture)


def _threads() -> int:
    return len(os.listdir("/proc/self/task"))


@pytest.fixture
def two_torch_threads():
    """A team needs two threads, whatever an earlier engine load set (the suite runs at one)."""
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(before)


@pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="one CPU: OpenMP starts no team")
def test_release_frees_the_calling_threads_team(two_torch_threads):
    seen: list[tuple[int, int, int]] = []

    def work() -> None:
        before = _threads()
        torch.ones(8_000_000).mul_(2.0)          # a parallel region: this thread gets a team
        during = _threads()
        assert release_thread_team()
        seen.append((before, during, _threads()))

    thread = threading.Thread(target=work)
    thread.start()
    thread.join()
    before, during, after = seen[0]
    assert during > before and after == before


def test_loading_thread_releases_its_team(tiny_model_dir, monkeypatch):  # noqa: F811
    calls = []
    monkeypatch.setattr("engine.model_engine.release_thread_team", lambda: calls.append(threading.get_ident()))
    Engine(load_settings(model=str(tiny_model_dir), device="cpu", dtype="float32", quant="none")).load()
    assert calls == [threading.get_ident()]
