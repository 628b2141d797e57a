"""OpenAI's Files and Batches endpoints (``/v1/files``, ``/v1/batches``) on the job queue.

A batch's lines become ordinary ``chat`` jobs (:mod:`web.openai.batch_lines`), so they
spread over every worker and get prefix routing; its progress and output are read from
those jobs (:mod:`web.openai.batch_flow`). Files hold UTF-8 JSONL, at most
``MINISERVE_MAX_FILE_BYTES`` (a 413 beyond); a key holds at most ``MINISERVE_MAX_FILES_PER_KEY``
files and ``MINISERVE_MAX_FILE_STORE_BYTES_PER_KEY`` bytes at once (a 429 beyond), and
``DELETE /v1/files/{id}`` frees them before the job TTL does.
"""
from __future__ import annotations

from typing import Any

from flask import Response, jsonify
from flask_openapi3 import APIBlueprint, FileStorage, Tag

from core.batches import NotFound, StoredFile, new_file_id
from core.file_quota import FileQuota, QuotaExceeded
from web.context import ctx, request_owner
from web.errors import ApiError
import web.openai.batch_flow as batch_flow
from web.openai.batch_schemas import (
    BatchCreate, BatchList, BatchListQuery, BatchObject, BatchPath, FileContent, FileDeleted, FileObject, FilePath,
    FileUpload,
)
from web.openai.schemas import OpenAIError

api = APIBlueprint("openai_batch", __name__, url_prefix="/v1",
                   abp_tags=[Tag(name="openai-batch", description="OpenAI Files and Batch API (through the queue)")])
ERRORS: dict[int, Any] = {code: OpenAIError for code in (400, 401, 404, 413, 415, 429, 503)}


def _owner() -> str:
    return request_owner() or ""


def _file(file_id: str, content: bool = True) -> StoredFile:
    try:
        return batch_flow.batch_store().get_file(file_id, owner=request_owner(), content=content)
    except NotFound:
        raise ApiError(404, "file_not_found", f"no file '{file_id[:100]}'", field="file_id") from None


def _batch(batch_id: str) -> Any:
    try:
        return batch_flow.batch_store().get_batch(batch_id, owner=request_owner())
    except NotFound:
        raise ApiError(404, "batch_not_found", f"no batch '{batch_id[:100]}'", field="batch_id") from None


def _text(upload: FileStorage) -> str:
    """The uploaded file's text, checked: size, UTF-8."""
    limit = ctx().settings.max_file_bytes
    data = upload.read(limit + 1)
    if len(data) > limit:
        raise ApiError(413, "file_too_large", f"file: over {limit} bytes (MINISERVE_MAX_FILE_BYTES)", field="file")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise ApiError(400, "validation_error", "file: not UTF-8 text", field="file") from None


@api.post("/files", summary="Upload a JSONL file of batch requests (multipart: purpose=batch, file)",
          responses={200: FileObject, **ERRORS})
def create_file(form: FileUpload):
    text = _text(form.file)
    file_id = new_file_id()
    _reserve(file_id, len(text.encode("utf-8")))
    stored = batch_flow.batch_store().put_file(form.purpose, form.file.filename or "upload.jsonl", text, _owner(),
                                               file_id=file_id)
    return jsonify(stored.openai_object(ctx().settings.job_ttl_s))


def _reserve(file_id: str, size: int) -> None:
    """Count the upload against its key's quota, or answer 429 naming the limit."""
    settings = ctx().settings
    quota = FileQuota(ctx().store.client, settings.max_files_per_key, settings.max_file_store_bytes_per_key,
                      settings.job_ttl_s)
    try:
        quota.reserve(_owner(), file_id, size)
    except QuotaExceeded as exc:
        setting = "MINISERVE_MAX_FILES_PER_KEY" if exc.what == "files" else "MINISERVE_MAX_FILE_STORE_BYTES_PER_KEY"
        raise ApiError(429, "file_quota_exceeded", f"file: this key already holds {exc.held} {exc.what} of "
                       f"{exc.limit} ({setting}); delete files with DELETE /v1/files/{{id}}", field="file",
                       retry_after=60) from None


@api.delete("/files/<file_id>", summary="Delete a file (frees its bytes from the key's quota)",
            responses={200: FileDeleted, **ERRORS})
def delete_file(path: FilePath):
    stored = _file(path.file_id, content=False)
    batch_flow.batch_store().delete_file(stored.id, owner=request_owner())
    return jsonify({"id": stored.id, "object": "file", "deleted": True})


@api.get("/files/<file_id>", summary="A file's metadata", responses={200: FileObject, **ERRORS})
def retrieve_file(path: FilePath):
    return jsonify(_file(path.file_id).openai_object(ctx().settings.job_ttl_s))


@api.get("/files/<file_id>/content", summary="A file's content (input, output or error JSONL)",
         responses={200: FileContent, **ERRORS})
def file_content(path: FilePath):
    return Response(_file(path.file_id).content, mimetype="application/jsonl")


@api.post("/batches", summary="Start a batch (answers `validating`; its lines become jobs right after)",
          responses={200: BatchObject, **ERRORS})
def create_batch(body: BatchCreate):
    stored = _file(body.input_file_id, content=False)  # the lines are read after the answer (batch_intake)
    if stored.purpose != "batch":
        raise ApiError(400, "validation_error", "input_file_id: not a file with purpose batch", field="input_file_id")
    record = batch_flow.start_batch(stored.id, body.endpoint, body.completion_window, body.metadata, _owner(),
                                    body.webhook_url)
    return jsonify(record.object)


@api.get("/batches/<batch_id>", summary="A batch: status, request_counts, output and error files",
         responses={200: BatchObject, **ERRORS})
def retrieve_batch(path: BatchPath):
    return jsonify(batch_flow.refresh(_batch(path.batch_id)).object)


@api.post("/batches/<batch_id>/cancel", summary="Cancel a batch (its open jobs are cancelled)",
          responses={200: BatchObject, **ERRORS})
def cancel_batch(path: BatchPath):
    return jsonify(batch_flow.cancel(_batch(path.batch_id)).object)


@api.get("/batches", summary="Recent batches, newest first (after: a batch id, limit)",
         responses={200: BatchList, **ERRORS})
def list_batches(query: BatchListQuery):
    records = batch_flow.batch_store().list_batches(request_owner(), query.after, query.limit + 1)
    shown = [batch_flow.refresh(r).object for r in records[:query.limit]]
    return jsonify({"object": "list", "data": shown, "first_id": shown[0]["id"] if shown else None,
                    "last_id": shown[-1]["id"] if shown else None, "has_more": len(records) > query.limit})
