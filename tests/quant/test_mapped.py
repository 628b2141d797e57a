"""A quantized embedding kept in a content-addressed file and mapped (engine.quant.mapped)."""
from __future__ import annotations

import os

import pytest
import torch

from engine.quant.layer import QuantizedEmbedding
from engine.quant.mapped import map_tensors, resident_bytes


def _tables(seed: int = 0) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(0, 256, (4096, 1000), dtype=torch.uint8, generator=gen),  # ~4 MB, odd row size
            torch.randn(4096, 28, generator=gen).to(torch.float16)]


def test_mapped_tensors_equal_the_originals_and_share_one_content_named_file(tmp_path):
    tables = _tables()
    views = map_tensors(tables, tmp_path)
    assert all(torch.equal(v, t) and v.dtype == t.dtype for v, t in zip(views, tables))
    files = list(tmp_path.glob("*.bin"))
    assert len(files) == 1 and not list(tmp_path.glob("*.part"))
    written = files[0].stat().st_mtime_ns
    again = map_tensors(_tables(), tmp_path)            # same bytes: the file is reused, not rewritten
    assert torch.equal(again[1], tables[1]) and files[0].stat().st_mtime_ns == written
    map_tensors(_tables(seed=1), tmp_path)              # other bytes: another file
    assert len(list(tmp_path.glob("*.bin"))) == 2


def test_only_the_pages_read_become_resident(tmp_path):
    codes, scales = map_tensors(_tables(), tmp_path)
    assert resident_bytes(codes) == 0
    total = sum(t.numel() * t.element_size() for t in (codes, scales))
    assert int(codes[[5, 2000, 4000]].sum()) >= 0
    held = resident_bytes(codes)
    assert 0 < held <= total // 8, (held, total)        # a few pages (fault-around), not the table
    assert resident_bytes(torch.zeros(10)) is None       # heap memory is not a file mapping


def test_a_directory_that_cannot_be_written_keeps_the_table_in_memory(tmp_path, caplog):
    if os.geteuid() == 0:
        blocked = tmp_path / "file"
        blocked.write_text("a file where the directory should be")
        directory = blocked / "tables"
    else:
        directory = tmp_path / "ro"
        directory.mkdir(mode=0o500)
    emb = QuantizedEmbedding.from_table(torch.randn(40, 64))
    assert emb.mapped(directory) is emb
    assert any("table_not_mapped" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_a_mapped_embedding_looks_up_the_same_rows(tmp_path, dtype):
    table = torch.randn(300, 96) * 0.05
    emb = QuantizedEmbedding.from_table(table, dtype=dtype)
    mapped = emb.mapped(tmp_path)
    assert mapped is not emb and resident_bytes(mapped.qweight) is not None
    ids = torch.tensor([[0, 299, 7], [7, 7, 150]])
    assert torch.equal(mapped.lookup(ids), emb.lookup(ids)) and mapped.shape == emb.shape
