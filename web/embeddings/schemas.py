"""Request and response models of the embedding routes (``/openapi.json`` shows them).

Every field of OpenAI's embeddings request is honoured or refused: ``input``, ``model``,
``encoding_format`` (``float`` | ``base64``), ``dimensions`` (only the model's own size:
the bundled models were not trained to be shortened), ``user`` (accepted; it names the end
user for the caller's logs, and ours never hold it). An unknown field is a 400 naming it.
Ollama's ``/api/embed``: ``model``, ``input``, ``truncate``, ``dimensions``, ``options``
(none is known for embeddings: any key is a 400 naming it), ``keep_alive`` (accepted: a
worker keeps its model loaded).
"""
from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

TokenIds = list[int]


class EmbeddingRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    input: str | list[str] | TokenIds | list[TokenIds] = Field(
        description="A string, a list of strings, a list of token ids (the model's own vocabulary, fed as "
                    "given), or a list of such lists")
    model: str | None = Field(default=None, max_length=256,
                              description="An embedding model's id; omitted: the cluster's only embedding model")
    encoding_format: Literal["float", "base64"] = Field(
        default="float", description="base64: each vector as little-endian float32 bytes, as OpenAI sends them")
    dimensions: int | None = Field(default=None, ge=1, description="Only the model's own size is accepted")
    user: str | None = Field(default=None, max_length=256, description="Accepted; not stored")


class EmbeddingItem(BaseModel):
    object: Literal["embedding"] = "embedding"
    index: int
    embedding: list[float] | str


class EmbeddingUsage(BaseModel):
    prompt_tokens: int
    total_tokens: int


class EmbeddingList(BaseModel):
    object: Literal["list"] = "list"
    data: list[EmbeddingItem]
    model: str
    usage: EmbeddingUsage


class OllamaEmbedRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    model: str | None = Field(default=None, max_length=256)
    input: str | list[str] = Field(description="A string or a list of strings")
    truncate: bool = Field(default=True, description="Cut inputs longer than the model reads (false: a 400)")
    dimensions: int | None = Field(default=None, ge=1, description="Only the model's own size is accepted")
    options: dict[str, Any] | None = Field(default=None, description="No option applies to embeddings: "
                                           "any key is refused")
    keep_alive: str | int | float | None = Field(default=None, description="Accepted: workers keep their "
                                                 "model loaded")


class OllamaEmbedResponse(BaseModel):
    model: str
    embeddings: list[list[float]]
    total_duration: int = Field(description="nanoseconds, as the web saw the request")
    load_duration: int = Field(description="nanoseconds the worker spent loading the model for it (0: loaded)")
    prompt_eval_count: int


class OllamaError(BaseModel):
    error: str
