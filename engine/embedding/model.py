"""A sentence-embedding model: a BERT-style encoder, pooled and normalized as its
sentence-transformers config says, in fp32.

The folder is sentence-transformers' layout: ``modules.json`` lists the modules (the
transformer, ``Pooling``, optionally ``Normalize``), ``1_Pooling/config.json`` (or wherever
the Pooling module's path points) picks the pooling, ``sentence_bert_config.json`` gives the
longest input (``max_seq_length``). We read those files ourselves and run transformers'
``AutoModel`` and the ``tokenizers`` library, so the vectors are sentence-transformers' own
computation (checked in tests/embeddings/test_embedding_real.py) without its package at run
time. A pooling or module we do not implement is a load error, never a wrong vector.

Thread use: :class:`EmbeddingModel.encode` (tokenizing) reads only and runs in job threads;
:meth:`EmbeddingModel.embed` (the forward) is called by the batcher's one thread.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch

from engine.errors import ModelLoadError

POOLING_MODES = {"pooling_mode_mean_tokens": "mean", "pooling_mode_cls_token": "cls"}
ST_TRANSFORMER = "sentence_transformers.models.Transformer"
ST_POOLING = "sentence_transformers.models.Pooling"
ST_NORMALIZE = "sentence_transformers.models.Normalize"


class InputTooLong(ValueError):
    """An input holds more tokens than the model reads, and the request did not ask to truncate."""

    def __init__(self, index: int, tokens: int, limit: int) -> None:
        super().__init__(f"input[{index}] has {tokens} tokens; this model reads at most {limit}")
        self.index, self.tokens, self.limit = index, tokens, limit


class BadTokenId(ValueError):
    """A token-id input holds an id outside the model's vocabulary."""

    def __init__(self, index: int, token: int, vocab: int) -> None:
        super().__init__(f"input[{index}] holds token id {token}; this model's ids are 0..{vocab - 1}")
        self.index = index


@dataclass(frozen=True)
class EmbeddingConfig:
    """What the sentence-transformers files say about turning token states into one vector."""

    pooling: str            # "mean" | "cls"
    normalize: bool         # L2-normalize the pooled vector (a Normalize module is listed)
    max_tokens: int         # the longest input, special tokens included (max_seq_length)
    dimensions: int         # the vector's size (the pooling's word_embedding_dimension)

    @classmethod
    def read(cls, folder: Path, max_positions: int) -> "EmbeddingConfig":
        modules = _json(folder / "modules.json")
        types = [m.get("type") for m in modules]
        unknown = [t for t in types if t not in (ST_TRANSFORMER, ST_POOLING, ST_NORMALIZE)]
        if types[:2] != [ST_TRANSFORMER, ST_POOLING] or unknown:
            raise ModelLoadError(f"{folder}: modules {types} are not Transformer, Pooling[, Normalize]; "
                                 "this engine implements only those")
        pooling_dir = folder / next(m.get("path", "") for m in modules if m.get("type") == ST_POOLING)
        pooling = _json(pooling_dir / "config.json")
        chosen = [mode for key, mode in POOLING_MODES.items() if pooling.get(key)]
        others = [k for k, v in pooling.items() if k.startswith("pooling_mode_") and v and k not in POOLING_MODES]
        if len(chosen) != 1 or others:
            raise ModelLoadError(f"{pooling_dir}/config.json asks for pooling {chosen + others}; "
                                 "this engine implements exactly one of mean or cls")
        bert = folder / "sentence_bert_config.json"
        max_tokens = int(_json(bert).get("max_seq_length") or max_positions) if bert.is_file() else max_positions
        return cls(pooling=chosen[0], normalize=ST_NORMALIZE in types, max_tokens=min(max_tokens, max_positions),
                   dimensions=int(pooling["word_embedding_dimension"]))


def _json(path: Path):
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ModelLoadError(f"cannot read {path}: {exc}") from None


def pool(hidden: torch.Tensor, mask: torch.Tensor, mode: str) -> torch.Tensor:
    """[batch, tokens, dim] states and a [batch, tokens] 0/1 mask -> [batch, dim].
    ``mean``: the mean over the real tokens (pads excluded), as sentence-transformers computes
    it (sum / clamp(count, 1e-9)); ``cls``: the first token's state."""
    if mode == "cls":
        return hidden[:, 0]
    weights = mask.unsqueeze(-1).to(hidden.dtype)
    return (hidden * weights).sum(1) / weights.sum(1).clamp(min=1e-9)


def normalize(vectors: torch.Tensor) -> torch.Tensor:
    """Unit L2 length (torch's ``F.normalize``: a zero vector stays zero)."""
    return torch.nn.functional.normalize(vectors, p=2, dim=1)


def pad_batch(batch: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded ids and the attention mask of a batch of token-id lists."""
    width = max(len(ids) for ids in batch)
    ids = torch.full((len(batch), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(batch), width), dtype=torch.long)
    for row, tokens in enumerate(batch):
        ids[row, :len(tokens)] = torch.tensor(tokens, dtype=torch.long)
        mask[row, :len(tokens)] = 1
    return ids, mask


class EmbeddingModel:
    """The loaded encoder, its tokenizer and its pooling."""

    def __init__(self, folder: Path, threads: int = 0) -> None:
        from tokenizers import Tokenizer
        from transformers import AutoConfig, AutoModel

        if threads > 0:
            torch.set_num_threads(threads)
        try:
            config = AutoConfig.from_pretrained(folder)
            self.encoder = AutoModel.from_pretrained(folder, dtype=torch.float32).eval()
            self.tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
        except (OSError, ValueError) as exc:
            raise ModelLoadError(f"cannot load the embedding model in {folder}: {exc}") from None
        self.tokenizer.no_truncation()
        self.tokenizer.no_padding()
        self.config = EmbeddingConfig.read(folder, int(getattr(config, "max_position_embeddings", 512)))
        self.vocab_size = int(config.vocab_size)
        self.pad_id = int(getattr(config, "pad_token_id", None) or 0)

    def encode(self, texts: list[str], truncate: bool) -> list[list[int]]:
        """Token ids with the model's special tokens; an input over ``max_tokens`` is cut to it
        (its last special token kept, as the tokenizer's own truncation does) or refused."""
        out = []
        for index, encoding in enumerate(self.tokenizer.encode_batch(texts)):
            out.append(self.fit(index, list(encoding.ids), truncate))
        return out

    def fit(self, index: int, ids: list[int], truncate: bool) -> list[int]:
        limit = self.config.max_tokens
        if len(ids) <= limit:
            return ids
        if not truncate:
            raise InputTooLong(index, len(ids), limit)
        return ids[:limit - 1] + ids[-1:]

    def check_ids(self, inputs: list[list[int]], truncate: bool) -> list[list[int]]:
        """Token-id inputs, taken as the model's own ids and fed as given (no special tokens
        added, as a tokenizer's ``encode`` output already holds them)."""
        for index, ids in enumerate(inputs):
            bad = next((t for t in ids if not 0 <= t < self.vocab_size), None)
            if bad is not None:
                raise BadTokenId(index, bad, self.vocab_size)
        return [self.fit(index, ids, truncate) for index, ids in enumerate(inputs)]

    @torch.inference_mode()
    def embed(self, batch: list[list[int]]) -> torch.Tensor:
        """[len(batch), dimensions] fp32 vectors of one padded batch (one forward)."""
        ids, mask = pad_batch(batch, self.pad_id)
        hidden = self.encoder(input_ids=ids, attention_mask=mask,
                              token_type_ids=torch.zeros_like(ids)).last_hidden_state
        vectors = pool(hidden, mask, self.config.pooling)
        return normalize(vectors) if self.config.normalize else vectors
