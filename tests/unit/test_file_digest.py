"""The GGUF digest is remembered on disk, so a later start does not read the whole file."""
from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from core import file_digest
from core.file_digest import file_sha256


def _forget_in_memory() -> None:
    file_digest._digest.cache_clear()


def test_a_remembered_digest_is_read_back_without_hashing_the_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    model = tmp_path / "model.gguf"
    model.write_bytes(b"weights" * 1000)
    records = tmp_path / "digests"
    first = file_sha256(model, remember_in=records)
    assert first == hashlib.sha256(model.read_bytes()).hexdigest()
    assert len(list(records.iterdir())) == 1

    _forget_in_memory()
    monkeypatch.setattr(file_digest, "_digest", lambda *args: pytest.fail("the file was hashed again"))
    assert file_sha256(model, remember_in=records) == first


def test_a_rewritten_file_is_hashed_anew(tmp_path: Path) -> None:
    model = tmp_path / "model.gguf"
    model.write_bytes(b"a" * 4096)
    records = tmp_path / "digests"
    first = file_sha256(model, remember_in=records)
    stat = model.stat()
    model.write_bytes(b"b" * 4096)  # same size, a later mtime (set, not waited for: timestamps are coarse)
    os.utime(model, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))
    _forget_in_memory()
    assert file_sha256(model, remember_in=records) == hashlib.sha256(b"b" * 4096).hexdigest() != first


def test_a_damaged_record_is_ignored_and_replaced(tmp_path: Path) -> None:
    model = tmp_path / "model.gguf"
    model.write_bytes(b"c" * 100)
    records = tmp_path / "digests"
    file_sha256(model, remember_in=records)
    (record,) = records.iterdir()
    record.write_text("not a digest")
    _forget_in_memory()
    assert file_sha256(model, remember_in=records) == hashlib.sha256(b"c" * 100).hexdigest()
    assert record.read_text().strip() == hashlib.sha256(b"c" * 100).hexdigest()
