"""A GGUF file's tensor table and scalar metadata, read in milliseconds, its data mapped.

Why not gguf-py's ``GGUFReader``: it turns every metadata value into numpy arrays, the
tokenizer's 151k tokens and merges included, which took 17 s and 500 MB of memory for the
default model's header -- longer than the whole rest of a start. Running from the file needs
only the tensor table (name, type, shape, offset) and a few scalars, so this parser walks the
header once, skipping arrays by their lengths, and maps the file read-only with numpy: each
tensor's data is a view of the mapping (no copy), and only the pages a step reads become
resident. The layout is GGUF v2/v3 (little-endian), as gguf-py writes and reads it.
"""
from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

from engine.errors import ModelLoadError

_MAGIC = b"GGUF"
_STRING, _ARRAY = 8, 9
# value type -> (struct format) for the fixed-size scalars
_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_NUMPY = {GGMLQuantizationType.F32: np.float32, GGMLQuantizationType.F16: np.float16}


class GGUFIndexError(ModelLoadError):
    """A file whose GGUF header cannot be read."""


@dataclass(frozen=True)
class TensorInfo:
    name: str
    ggml_type: GGMLQuantizationType
    dims: tuple[int, ...]   # as GGUF lists them: the fastest-varying (row length) first
    offset: int             # from the file's start

    @property
    def shape(self) -> tuple[int, ...]:
        """numpy/torch order: ``[rows, row length]`` for a matrix."""
        return tuple(reversed(self.dims))

    @property
    def nbytes(self) -> int:
        block_elems, block_bytes = GGML_QUANT_SIZES[self.ggml_type]
        return int(np.prod(self.dims)) // block_elems * block_bytes


@dataclass
class GGUFIndex:
    """The tensor table and scalar metadata of one file, and its read-only mapping."""

    path: Path
    metadata: dict[str, object]      # scalar and string values (arrays skipped)
    tensors: dict[str, TensorInfo]
    mapping: np.memmap = field(repr=False)

    @property
    def architecture(self) -> str:
        arch = self.metadata.get("general.architecture")
        if not isinstance(arch, str):
            raise GGUFIndexError(f"GGUF file {self.path} has no general.architecture")
        return arch

    def release(self, name: str, start: int = 0, stop: int | None = None) -> None:
        """Drop the tensor's pages (those wholly inside its bytes ``start:stop``) from this
        process's resident memory; they stay in the page cache. For bytes that were copied
        elsewhere (interleaved) and are not read here again."""
        info = self.tensors[name]
        page = mmap.PAGESIZE
        stop = info.nbytes if stop is None else min(stop, info.nbytes)
        start = -(-(info.offset + start) // page) * page
        stop = (info.offset + stop) // page * page
        if stop > start:
            self.mapping._mmap.madvise(mmap.MADV_DONTNEED, start, stop - start)

    def data(self, name: str) -> np.ndarray:
        """The tensor's bytes as a view of the mapping: ``[rows, row_bytes]`` uint8 for a block
        format, the float values ``shape`` for F32/F16, uint8 bytes otherwise."""
        info = self.tensors[name]
        raw = self.mapping[info.offset:info.offset + info.nbytes]
        if info.ggml_type in _NUMPY:
            return raw.view(_NUMPY[info.ggml_type]).reshape(info.shape)
        rows = int(np.prod(info.shape[:-1])) if len(info.shape) > 1 else 1
        return raw.reshape(rows, info.nbytes // rows)


class _Cursor:
    def __init__(self, buffer: memoryview) -> None:
        self.buffer, self.at = buffer, 0

    def scalar(self, fmt: str) -> object:
        value = struct.unpack_from(fmt, self.buffer, self.at)[0]
        self.at += struct.calcsize(fmt)
        return value

    def string(self) -> str:
        length = self.scalar("<Q")
        text = bytes(self.buffer[self.at:self.at + length]).decode("utf-8", errors="replace")
        self.at += length
        return text

    def value(self, kind: int) -> object:
        """A value of GGUF type ``kind``; arrays are skipped (None)."""
        if kind in _SCALARS:
            return self.scalar(_SCALARS[kind])
        if kind == _STRING:
            return self.string()
        if kind == _ARRAY:
            self.skip_array()
            return None
        raise GGUFIndexError(f"unknown GGUF value type {kind}")

    def skip_array(self) -> None:
        kind, count = self.scalar("<I"), self.scalar("<Q")
        if kind in _SCALARS:
            self.at += count * struct.calcsize(_SCALARS[kind])
        elif kind == _STRING:
            for _ in range(count):
                self.at += struct.unpack_from("<Q", self.buffer, self.at)[0] + 8
        elif kind == _ARRAY:
            for _ in range(count):
                self.skip_array()
        else:
            raise GGUFIndexError(f"unknown GGUF array type {kind}")


def read_index(path: Path | str) -> GGUFIndex:
    """Parse ``path``'s header; any failure is a :class:`GGUFIndexError` naming the file."""
    path = Path(path)
    try:
        with open(path, "rb") as handle, mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as whole:
            metadata, tensors = _parse(memoryview(whole), path)
    except (OSError, ValueError, struct.error, IndexError) as exc:
        raise GGUFIndexError(f"GGUF file {path} is corrupt or truncated ({type(exc).__name__}: {exc})") from exc
    mapping = np.memmap(path, dtype=np.uint8, mode="r")
    for info in tensors.values():
        if info.offset + info.nbytes > mapping.shape[0]:
            raise GGUFIndexError(f"GGUF file {path} is truncated: tensor {info.name} ends past the file")
    return GGUFIndex(path, metadata, tensors, mapping)


def _parse(buffer: memoryview, path: Path) -> tuple[dict[str, object], dict[str, TensorInfo]]:
    try:
        cursor = _Cursor(buffer)
        if bytes(buffer[:4]) != _MAGIC:
            raise GGUFIndexError(f"{path} is not a GGUF file (no GGUF magic)")
        cursor.at = 4
        version = cursor.scalar("<I")
        if version not in (2, 3):
            raise GGUFIndexError(f"GGUF file {path} has version {version}; versions 2 and 3 are read")
        n_tensors, n_kv = cursor.scalar("<Q"), cursor.scalar("<Q")
        metadata: dict[str, object] = {}
        for _ in range(n_kv):
            key = cursor.string()
            value = cursor.value(cursor.scalar("<I"))
            if value is not None:
                metadata[key] = value
        infos = []
        for _ in range(n_tensors):
            name = cursor.string()
            n_dims = cursor.scalar("<I")
            dims = tuple(cursor.scalar("<Q") for _ in range(n_dims))
            infos.append((name, GGMLQuantizationType(cursor.scalar("<I")), dims, cursor.scalar("<Q")))
        alignment = int(metadata.get("general.alignment", 32))
        start = -(-cursor.at // alignment) * alignment
        return metadata, {n: TensorInfo(n, kind, dims, start + offset) for n, kind, dims, offset in infos}
    finally:
        buffer.release()
