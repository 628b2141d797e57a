"""What an embedding worker holds: the loaded model and the loop that owns it.

Built by the worker's runtime in place of the chat ``Engine`` when its model is an
embedding model (core.model_source.model_kind); same shape where the runtime needs one:
``load()`` (raises ``ModelLoadError``), ``info()`` and ``stats()`` for the heartbeat.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from core.model_source import EMBEDDING_MODEL, model_id
from core.settings import Settings
from engine.embedding.batcher import EmbedHandle, EmbeddingBatcher
from engine.embedding.model import EmbeddingModel
from engine.embedding.source import prepare_embedding_model
from engine.errors import ModelLoadError


@dataclass(frozen=True)
class Embedded:
    """One request's answer: fp32 vectors in the inputs' order, and what it cost."""

    vectors: Any            # torch.Tensor [inputs, dimensions]
    prompt_tokens: int
    forwards: int           # forwards that ran some of its inputs (several: shared or long)


class EmbeddingService:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.model: EmbeddingModel | None = None
        self.batcher: EmbeddingBatcher | None = None
        self.load_s = 0.0
        self.path: Path | None = None

    def load(self) -> None:
        started = time.perf_counter()
        self.path = self._folder()
        self.model = EmbeddingModel(self.path, threads=self.settings.threads)
        self.batcher = EmbeddingBatcher(self.model, max_batch=self.settings.embedding_max_batch)
        self.load_s = time.perf_counter() - started

    def _folder(self) -> Path:
        if self.settings.model == EMBEDDING_MODEL:
            return prepare_embedding_model(self.settings)
        folder = Path(self.settings.model).expanduser()
        if not (folder / "modules.json").is_file():
            raise ModelLoadError(f"{folder} is not a sentence-transformers folder (no modules.json)")
        return folder

    @property
    def max_tokens(self) -> int:
        assert self.model is not None
        return self.model.config.max_tokens

    def tokens(self, texts: list[str] | None, ids: list[list[int]] | None, truncate: bool) -> list[list[int]]:
        """The inputs as token ids (in the calling job thread: the tokenizer only reads)."""
        assert self.model is not None
        return self.model.encode(texts, truncate) if texts is not None else self.model.check_ids(ids or [], truncate)

    def submit(self, inputs: list[list[int]]) -> EmbedHandle:
        assert self.batcher is not None
        return self.batcher.submit(inputs)

    def info(self) -> dict[str, Any]:
        config = self.model.config if self.model else None
        return {"model": model_id(self.settings.model), "path": str(self.path), "device": "cpu", "dtype": "float32",
                "load_s": round(self.load_s, 3), "dimensions": config.dimensions if config else None,
                "max_tokens": config.max_tokens if config else None,
                "pooling": config.pooling if config else None}

    def stats(self) -> dict[str, Any]:
        batcher = self.batcher
        return {"model_loaded": self.model is not None,
                "embedding_forwards": batcher.forwards if batcher else 0,
                "embedding_inputs": batcher.inputs_run if batcher else 0}
