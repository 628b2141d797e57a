"""Request and response models of the Files and Batches routes, so ``/openapi.json`` is exact
(OpenAI's File and Batch objects, as the openai client's own types read them)."""
from __future__ import annotations

from typing import Any, Literal

from flask_openapi3 import FileStorage
from pydantic import BaseModel, ConfigDict, Field

ENDPOINTS = ("/v1/chat/completions", "/v1/completions")
BatchStatus = Literal["validating", "in_progress", "finalizing", "completed", "failed", "expired",
                      "cancelling", "cancelled"]


class FilePath(BaseModel):
    file_id: str = Field(max_length=100)


class BatchPath(BaseModel):
    batch_id: str = Field(max_length=100)


class FileUpload(BaseModel):
    """``POST /v1/files`` (multipart/form-data), as the openai client sends it."""

    purpose: Literal["batch"] = Field(description="only batch input files")
    file: FileStorage = Field(description="UTF-8 JSONL, at most MINISERVE_MAX_FILE_BYTES")


class BatchCreate(BaseModel):
    """``POST /v1/batches``: the endpoint every line calls; only a 24 h window."""

    model_config = ConfigDict(extra="forbid", strict=True)
    input_file_id: str = Field(max_length=100)
    endpoint: Literal[ENDPOINTS] = Field(description="the endpoint every line calls")  # type: ignore[valid-type]
    completion_window: Literal["24h"] = Field(description="also each line's job's deadline: a line still "
                                              "queued at the batch's expires_at ends `expired`")
    metadata: dict[str, str] | None = Field(default=None, max_length=16)
    webhook_url: str | None = Field(default=None, min_length=1, max_length=2048, description=(
        "MiniServe extension: every line's job POSTs its record here when it ends (as POST /jobs' "
        "webhook_url; the record's id is the line's request_id in the output file)"))


class BatchListQuery(BaseModel):
    model_config = ConfigDict(extra="forbid")  # an unknown query parameter is a 400, as the document says

    after: str | None = Field(default=None, max_length=100)
    limit: int = Field(default=20, ge=1, le=100)


class FileDeleted(BaseModel):
    id: str
    object: Literal["file"]
    deleted: bool


class FileObject(BaseModel):
    id: str
    object: Literal["file"]
    bytes: int
    created_at: int
    expires_at: int
    filename: str
    purpose: Literal["batch", "batch_output"]
    status: Literal["processed"]
    status_details: None = None


class FileContent(BaseModel):
    model_config = ConfigDict(openapi_extra={
        "description": "the file's JSONL", "content": {"application/jsonl": {"schema": {"type": "string"}}}})


class RequestCounts(BaseModel):
    total: int
    completed: int
    failed: int


class BatchErrors(BaseModel):
    object: Literal["list"]
    data: list[dict[str, Any]]


class BatchObject(BaseModel):
    id: str
    object: Literal["batch"]
    endpoint: str
    errors: BatchErrors | None
    input_file_id: str
    completion_window: str
    status: BatchStatus
    output_file_id: str | None
    error_file_id: str | None
    created_at: int
    in_progress_at: int | None
    expires_at: int
    finalizing_at: int | None
    completed_at: int | None
    failed_at: int | None
    expired_at: int | None
    cancelling_at: int | None
    cancelled_at: int | None
    request_counts: RequestCounts
    metadata: dict[str, str] | None


class BatchList(BaseModel):
    object: Literal["list"]
    data: list[BatchObject]
    first_id: str | None
    last_id: str | None
    has_more: bool
