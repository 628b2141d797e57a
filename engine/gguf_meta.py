"""Read what a GGUF file says about itself (the ``gguf`` package), refusing a bad file early.

transformers dequantizes a GGUF for ~30-45 s before it notices a truncated file or a tensor
type it cannot read, and then fails with a bare ``ValueError``. Reading the header first costs
well under a second and turns every such case into a :class:`GGUFFileError` naming the file.
The metadata read here is also where the prepared folder's end-of-sequence ids, special tokens,
chat template and sampling defaults come from.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from engine.errors import ModelLoadError

# Tensor types transformers can turn into torch tensors: plain floats plus every type the
# gguf package can dequantize (gguf.quants._type_traits; checked with gguf 0.19).
_PLAIN_TYPES = frozenset({"F32", "F16", "F64"})
# general.sampling.* (written by llama.cpp's converter when the source has a
# generation_config.json) -> transformers GenerationConfig field.
SAMPLING_KEYS = {
    "general.sampling.temp": "temperature",
    "general.sampling.top_k": "top_k",
    "general.sampling.top_p": "top_p",
    "general.sampling.min_p": "min_p",
    "general.sampling.penalty_repeat": "repetition_penalty",
}


class GGUFFileError(ModelLoadError):
    """A GGUF file that cannot be served: corrupt, truncated or of an unreadable type."""


@dataclass(frozen=True)
class GGUFMeta:
    """The parts of a GGUF header MiniServe uses."""

    path: Path
    architecture: str
    tensor_types: dict[str, int]  # type name -> how many tensors
    chat_template: str | None = None
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()  # eos, then end-of-turn / end-of-message if distinct
    pad_token_id: int | None = None
    special_tokens: dict[str, str] = field(default_factory=dict)  # "eos_token" -> its text
    sampling: dict[str, float] = field(default_factory=dict)  # GenerationConfig field -> value


def readable_types() -> frozenset[str]:
    from gguf.quants import _type_traits

    return _PLAIN_TYPES | {kind.name for kind in _type_traits}


def read_gguf_meta(path: Path) -> GGUFMeta:
    """Parse the header and tensor table; any failure is a GGUFFileError naming ``path``."""
    from gguf import GGUFReader

    if not path.is_file():
        raise GGUFFileError(f"GGUF file {path} does not exist")
    try:
        reader = GGUFReader(path)
    except Exception as exc:  # the reader raises ValueError, IndexError, struct errors...
        raise GGUFFileError(f"GGUF file {path} is corrupt or truncated ({type(exc).__name__}: {exc})") from exc
    counts: dict[str, int] = {}
    for tensor in reader.tensors:
        counts[tensor.tensor_type.name] = counts.get(tensor.tensor_type.name, 0) + 1
    unreadable = sorted(set(counts) - readable_types())
    if unreadable:
        raise GGUFFileError(f"GGUF file {path} holds tensors of type {', '.join(unreadable)}, which "
                            f"transformers cannot dequantize; readable: {', '.join(sorted(readable_types()))}")
    fields = reader.fields
    architecture = _scalar(fields, "general.architecture")
    if not isinstance(architecture, str):
        raise GGUFFileError(f"GGUF file {path} has no general.architecture; it is not a model file")
    return _meta(path, fields, architecture, counts)


def _meta(path: Path, fields: dict[str, Any], architecture: str, counts: dict[str, int]) -> GGUFMeta:
    ids = {name: _scalar(fields, f"tokenizer.ggml.{name}_token_id") for name in ("bos", "eos", "eot", "eom", "padding")}
    eos = tuple(dict.fromkeys(int(ids[n]) for n in ("eos", "eot", "eom") if ids[n] is not None))
    specials = {f"{role}_token": _token_text(fields, ids[key])
                for role, key in (("bos", "bos"), ("eos", "eos"), ("pad", "padding")) if ids[key] is not None}
    sampling = {name: float(value) for key, name in SAMPLING_KEYS.items()
                if (value := _scalar(fields, key)) is not None}
    return GGUFMeta(path=path, architecture=architecture, tensor_types=counts,
                    chat_template=_scalar(fields, "tokenizer.chat_template"),
                    bos_token_id=None if ids["bos"] is None else int(ids["bos"]), eos_token_ids=eos,
                    pad_token_id=None if ids["padding"] is None else int(ids["padding"]),
                    special_tokens={k: v for k, v in specials.items() if v is not None}, sampling=sampling)


def _scalar(fields: dict[str, Any], key: str) -> Any:
    entry = fields.get(key)
    return None if entry is None else entry.contents()


def _token_text(fields: dict[str, Any], token_id: int | None) -> str | None:
    tokens = fields.get("tokenizer.ggml.tokens")
    if tokens is None or token_id is None or not 0 <= token_id < len(tokens.data):
        return None
    return bytes(tokens.parts[tokens.data[token_id]]).decode("utf-8", errors="replace")

