"""A file's sha256, read in chunks: how bundled GGUFs are verified and user GGUFs are keyed.

In ``core`` because both rooms need it: the engine prepares ``<cache>/models/gguf-<sha256>``
and the web finds the tokenizer in that same folder without importing the engine.

Hashing reads the whole file (about 0.6 GB/s: 8 s for an 8B Q4_K_M file), and both the web and
every worker need the digest at each start. So a digest is remembered in memory per
(path, size, mtime) and, when the caller names a folder, on disk as one small file per
(device, inode, size, mtime, ctime) -- the identity ``make`` and ``ccache`` trust. Writing a
file changes its mtime and ctime, and a rename changes its ctime, so both are hashed anew.
"""
from __future__ import annotations

import hashlib
import os
from functools import lru_cache
from pathlib import Path

_CHUNK = 8 * 1024 * 1024


def file_sha256(path: Path, show_progress: bool = False, remember_in: Path | None = None) -> str:
    """The sha256 of ``path`` (hex); a tqdm bar when asked (a 500 MB file takes a few seconds).
    ``remember_in``: a folder that keeps digests across processes (see the module docstring)."""
    stat = path.stat()
    record = None if remember_in is None else remember_in / _identity(stat)
    if record is not None and (known := _read_record(record)):
        return known
    digest = _digest(str(path.resolve()), stat.st_size, stat.st_mtime_ns, show_progress)
    if record is not None:
        _write_record(record, digest)
    return digest


def _identity(stat: os.stat_result) -> str:
    return f"{stat.st_dev}-{stat.st_ino}-{stat.st_size}-{stat.st_mtime_ns}-{stat.st_ctime_ns}"


def _read_record(record: Path) -> str | None:
    try:
        text = record.read_text().strip()
    except OSError:
        return None
    return text if len(text) == 64 and all(c in "0123456789abcdef" for c in text) else None


def _write_record(record: Path, digest: str) -> None:
    """Written whole or not at all (a rename), and never an error: the record only saves time."""
    try:
        record.parent.mkdir(parents=True, exist_ok=True)
        scratch = record.with_name(f".{record.name}.{os.getpid()}")
        scratch.write_text(digest + "\n")
        os.replace(scratch, record)
    except OSError:
        pass


@lru_cache(maxsize=16)
def _digest(path: str, size: int, mtime_ns: int, show_progress: bool) -> str:
    from tqdm import tqdm

    digest = hashlib.sha256()
    with open(path, "rb") as src, tqdm(total=size, unit="B", unit_scale=True, desc=f"sha256 {Path(path).name}",
                                       disable=not show_progress) as bar:
        while chunk := src.read(_CHUNK):
            digest.update(chunk)
            bar.update(len(chunk))
    return digest.hexdigest()
