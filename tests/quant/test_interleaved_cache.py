"""The interleaved matrices of a GGUF kept in a file between starts (engine.quant.interleaved_cache).

A first load writes them there and maps each as it is written; a second maps the finished file
and interleaves nothing. The bytes are those interleaved in memory, whichever way they came.
"""
from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest
import torch
from gguf import GGMLQuantizationType as T

from core.settings import load_settings
from engine.forward import Qwen2Forward
from engine.kv_cache import NoCache
from engine.loader import load_model
from engine.quant import gguf_native
from engine.quant.interleaved_cache import InterleavedCache
from engine.quant.model import forward_weights
from engine.quant.plan import PROJECTIONS
from tests.tiny_gguf import make_tiny_gguf

TYPES = {"*": "Q4_K", "attn_v": "Q6_K", "ffn_down": "Q6_K", "ffn_up": "Q5_0", "token_embd": "Q6_K", "output": "Q6_K"}
HERE = gguf_native.INTERLEAVED_BY_PATH[gguf_native.vector_path()]
needs_one = pytest.mark.skipif(not HERE & {T.Q4_K, T.Q6_K, T.Q5_0},
                               reason="this CPU's vector path interleaves none of the file's formats")


@pytest.fixture(scope="module")
def gguf_file(tmp_path_factory):
    return make_tiny_gguf(tmp_path_factory.mktemp("cached") / "k.gguf", types=TYPES, hidden_size=256,
                          intermediate_size=512)


def _load(cache_dir: Path, path: Path):
    """(the forward's weights, its interleaved parts in order) of a load with ``cache_dir``."""
    settings = load_settings(model=str(path), cache_dir=str(cache_dir), dtype="float32", device="cpu", quant="gguf")
    weights = forward_weights(load_model(settings).model)
    parts = [p for layer in weights.layers for name in PROJECTIONS for p in getattr(layer, name).parts]
    return weights, [p for p in parts + list(weights.lm_head.parts) if p.interleaved]


def _mapped_file_of(tensor: torch.Tensor) -> str | None:
    """The file whose mapping holds ``tensor``'s first byte (None: anonymous memory)."""
    address = tensor.data_ptr()
    with open("/proc/self/maps") as maps:
        for line in maps:
            fields = line.split(maxsplit=5)
            lo, hi = (int(x, 16) for x in fields[0].split("-"))
            if lo <= address < hi:
                return fields[5].strip() if len(fields) == 6 and fields[5].startswith("/") else None
    return None


def _logits(weights) -> torch.Tensor:
    return Qwen2Forward(weights)(torch.tensor([1, 5, 9, 20, 33]), NoCache(), last_only=False)


@needs_one
def test_a_second_load_maps_what_the_first_wrote(gguf_file, tmp_path, monkeypatch):
    first, written = _load(tmp_path, gguf_file)
    (toc,) = (tmp_path / "interleaved").glob("*.json")
    data_file = str(toc.with_suffix(".bin"))
    assert written and all(_mapped_file_of(p.data) == data_file for p in written)

    monkeypatch.setattr(gguf_native, "repack_x16", lambda *a, **k: pytest.fail("interleaved again"))
    second, read = _load(tmp_path, gguf_file)
    monkeypatch.undo()
    assert [p.ggml_type for p in read] == [p.ggml_type for p in written]
    assert all(_mapped_file_of(p.data) == data_file for p in read)

    (tmp_path / "memory").mkdir()
    (tmp_path / "memory" / "interleaved").write_text("a file where the cache folder would be")
    in_memory, moved = _load(tmp_path / "memory", gguf_file)   # the cache cannot be opened: as before
    assert all(_mapped_file_of(p.data) is None for p in moved)
    assert all(torch.equal(a.data, b.data) and torch.equal(a.data, c.data) for a, b, c in zip(written, read, moved))
    assert torch.equal(_logits(first), _logits(second)) and torch.equal(_logits(first), _logits(in_memory))


@needs_one
def test_a_changed_file_gets_a_new_cache_and_the_old_one_goes(gguf_file, tmp_path):
    path = tmp_path / "copy.gguf"
    path.write_bytes(gguf_file.read_bytes())
    _load(tmp_path, path)
    (old,) = (tmp_path / "interleaved").glob("*.json")
    os.utime(path, ns=(path.stat().st_atime_ns, path.stat().st_mtime_ns + 10**9))
    _load(tmp_path, path)
    (new,) = (tmp_path / "interleaved").glob("*.json")
    assert new != old and not old.with_suffix(".bin").exists() and new.with_suffix(".bin").exists()


# The cache on its own, with made-up bytes: what it does does not depend on the CPU.

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
