"""A file's sha256, read in chunks: how bundled GGUFs are verified and user GGUFs are keyed.

In ``core`` because both rooms need it: the engine prepares ``<cache>/models/gguf-<sha256>``
and the web finds the tokenizer in that same folder without importing the engine. A digest is
remembered per (path, size, mtime) so a process hashes a given file once.
"""
from __future__ import annotations

import hashlib
from functools import lru_cache
from pathlib import Path

_CHUNK = 8 * 1024 * 1024


def file_sha256(path: Path, show_progress: bool = False) -> str:
    """The sha256 of ``path`` (hex); a tqdm bar when asked (a 500 MB file takes a few seconds)."""
    stat = path.stat()
    return _digest(str(path.resolve()), stat.st_size, stat.st_mtime_ns, show_progress)


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
