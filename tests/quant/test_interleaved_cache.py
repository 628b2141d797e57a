"""The interleaved matrices of a GGUF kept in a file between starts (engine.quant.interleaved_cache),
with made-up bytes: what the cache does does not depend on the CPU. Loads of a real file through
it: tests/quant/test_gguf_native.py."""
from __future__ import annotations

import threading
from pathlib import Path

import pytest
import torch
from gguf import GGMLQuantizationType as T

from engine.quant.interleaved_cache import InterleavedCache

CAPACITY = 1 << 20


def _matrix(seed: int, rows: int = 32, row_bytes: int = 144) -> torch.Tensor:
    return torch.randint(0, 256, (rows, row_bytes), dtype=torch.uint8, generator=torch.Generator().manual_seed(seed))


def _write(cache: InterleavedCache, name: str, matrix: torch.Tensor) -> torch.Tensor:
    view = cache.add(name, int(T.Q4_K), *matrix.shape)
    for start in range(0, matrix.shape[0], 16):   # slab by slab, as the load writes
        cache.append(matrix[start:start + 16])
    return view


@pytest.fixture
def gguf(tmp_path) -> Path:
    path = tmp_path / "model.gguf"
    path.write_bytes(b"GGUF stand-in")
    return path


def test_written_matrices_read_back_equal_and_a_mismatch_is_not_read(gguf, tmp_path):
    a, b = _matrix(1, row_bytes=210), _matrix(2, rows=48, row_bytes=210)
    cache = InterleavedCache.open(tmp_path / "c", gguf, CAPACITY)
    assert cache.writing and cache.lookup("a", int(T.Q4_K), 32, 210) is None
    written = [_write(cache, "a", a), _write(cache, "b", b)]
    cache.finish()   # the views read the file from here on
    assert torch.equal(written[0], a) and torch.equal(written[1], b)
    assert written[1].data_ptr() - written[0].data_ptr() == -(-32 * 210 // 64) * 64   # packed, cache-line aligned

    again = InterleavedCache.open(tmp_path / "c", gguf, CAPACITY)
    assert not again.writing and again.add("c", int(T.Q4_K), 16, 144) is None
    assert torch.equal(again.lookup("a", int(T.Q4_K), 32, 210), a)
    assert torch.equal(again.lookup("b", int(T.Q4_K), 48, 210), b)
    assert again.lookup("a", int(T.Q6_K), 32, 210) is None and again.lookup("a", int(T.Q4_K), 16, 210) is None
    assert again.lookup("missing", int(T.Q4_K), 32, 210) is None and again.hits == 2


def test_what_does_not_fit_the_reserve_is_left_to_memory(gguf, tmp_path):
    cache = InterleavedCache.open(tmp_path / "c", gguf, 32 * 144)
    assert _write(cache, "a", _matrix(1)) is not None
    assert cache.add("b", int(T.Q4_K), 16, 144) is None
    cache.finish()
    assert set(InterleavedCache.open(tmp_path / "c", gguf, CAPACITY).entries) == {"a"}


def test_an_incomplete_file_is_written_again(gguf, tmp_path):
    cache = InterleavedCache.open(tmp_path / "c", gguf, CAPACITY)
    _write(cache, "a", _matrix(1))
    cache.finish()
    with open(cache.data_path, "r+b") as data:
        data.truncate(100)
    assert InterleavedCache.open(tmp_path / "c", gguf, CAPACITY).writing


def test_a_failed_load_leaves_no_file(gguf, tmp_path):
    cache = InterleavedCache.open(tmp_path / "c", gguf, CAPACITY)
    _write(cache, "a", _matrix(3))
    cache.abandon()
    assert cache.add("b", int(T.Q4_K), 16, 144) is None
    assert sorted(p.suffix for p in (tmp_path / "c").iterdir()) == [".lock"]
    assert InterleavedCache.open(tmp_path / "c", gguf, CAPACITY).writing


def test_a_folder_without_room_is_given_up(gguf, tmp_path):
    assert InterleavedCache.open(tmp_path / "c", gguf, 1 << 62) is None   # more than any disk
    assert sorted(p.suffix for p in (tmp_path / "c").iterdir()) == [".lock"]


def test_workers_starting_together_write_the_file_once(gguf, tmp_path):
    """The second opener waits on the first's lock, then reads its finished file."""
    first = InterleavedCache.open(tmp_path / "c", gguf, CAPACITY)
    opened: list[InterleavedCache] = []
    events: list[str] = []
    second = threading.Thread(target=lambda: (opened.append(InterleavedCache.open(tmp_path / "c", gguf, CAPACITY)),
                                              events.append("second opened")))
    second.start()
    _write(first, "a", _matrix(4))
    events.append("first finished")
    first.finish()
    second.join(timeout=60)
    assert events == ["first finished", "second opened"]
    assert not opened[0].writing and torch.equal(opened[0].lookup("a", int(T.Q4_K), 32, 144), _matrix(4))
