"""Files and batches of OpenAI's Batch API, kept in Redis with the job TTL.

A batch is an OpenAI ``batch`` object plus its *entries*: one per input line, either the
job the line became (``{"custom_id", "job_id", "body"}``) or the error that stopped it
(``{"custom_id", "error": {...}}``). The entries are a Redis list appended chunk by chunk
while the input is read (``append_entries``), so neither the reader nor a ``GET`` of a
batch still validating holds them all; ``progress_at`` says when the reader last appended
(a batch whose reader stopped is found by it). Nothing else is stored: progress and the
output file are read from the jobs themselves (``web.openai.batch_output``), so a worker
killed mid-batch (its job is re-run by the reaper) or a restarted web changes nothing.

Everything here is plain Redis; the web and the ``celery`` CLI task share it.
"""
from __future__ import annotations

import hashlib
import json
import time
import uuid
from dataclasses import dataclass
from typing import Any, Callable

import redis

from core import keys

TERMINAL_BATCH_STATES = ("completed", "failed", "expired", "cancelled")
UPDATE_RETRIES = 20


class NotFound(KeyError):
    """No file or batch with this id (or not visible to this owner)."""


def new_file_id() -> str:
    return f"file-{uuid.uuid4().hex}"


def new_batch_id() -> str:
    return f"batch_{uuid.uuid4().hex}"


def derived_file_id(batch_id: str, kind: str) -> str:
    """The id of a batch's output or error file: the same for every process that builds it,
    so two finalizers racing write the same file under the same id."""
    return f"file-{hashlib.md5(f'{batch_id}:{kind}'.encode()).hexdigest()}"


@dataclass(frozen=True)
class StoredFile:
    id: str
    purpose: str
    filename: str
    created_at: int
    owner: str
    content: str

    def openai_object(self, ttl_s: int) -> dict[str, Any]:
        return {"id": self.id, "object": "file", "bytes": len(self.content.encode("utf-8")),
                "created_at": self.created_at, "expires_at": self.created_at + ttl_s,
                "filename": self.filename, "purpose": self.purpose, "status": "processed",
                "status_details": None}


@dataclass
class BatchRecord:
    id: str
    owner: str
    object: dict[str, Any]  # OpenAI's batch object, as GET /v1/batches/{id} shows it
    progress_at: float = 0.0  # unix time the batch was created, then each time its intake appended entries

    @property
    def status(self) -> str:
        return str(self.object["status"])


@dataclass
class BatchStore:
    client: redis.Redis  # decode_responses=True
    ttl_s: int = 7 * 24 * 3600

    # ---- files -----------------------------------------------------------------------
    def put_file(self, purpose: str, filename: str, content: str, owner: str = "",
                 file_id: str | None = None) -> StoredFile:
        """Store a file (``file_id`` given: only when no file has it yet, which keeps a
        batch's derived output file the first finalizer's)."""
        stored = StoredFile(file_id or new_file_id(), purpose, filename, int(time.time()), owner, content)
        key = keys.file_key(stored.id)
        if not self.client.hsetnx(key, "content", content):
            return self.get_file(stored.id)
        pipe = self.client.pipeline(transaction=True)
        pipe.hset(key, mapping={"purpose": purpose, "filename": filename,
                                "created_at": stored.created_at, "owner": owner})
        pipe.expire(key, self.ttl_s)
        pipe.zadd(keys.FILES_INDEX, {stored.id: stored.created_at})
        pipe.execute()
        return stored

    def get_file(self, file_id: str, owner: str | None = None, content: bool = True) -> StoredFile:
        """The file; ``content=False`` reads its metadata only (``content`` is then ``""``):
        ``POST /v1/batches`` checks a 20 MB input without holding it."""
        fields = ["purpose", "filename", "created_at", "owner"] + (["content"] if content else [])
        try:
            raw = dict(zip(fields, self.client.hmget(keys.file_key(file_id), fields)))
        except keys.InvalidJobId:
            raise NotFound(file_id) from None
        if raw["purpose"] is None or (owner is not None and (raw["owner"] or "") != owner):
            raise NotFound(file_id)
        return StoredFile(file_id, raw["purpose"], raw["filename"] or "", int(raw["created_at"] or 0),
                          raw["owner"] or "", raw.get("content") or "")

    def delete_file(self, file_id: str, owner: str | None = None) -> None:
        """Remove a file (its owner's quota frees with it: the quota counts existing files)."""
        stored = self.get_file(file_id, owner, content=False)
        pipe = self.client.pipeline(transaction=True)
        pipe.delete(keys.file_key(stored.id))
        pipe.zrem(keys.FILES_INDEX, stored.id)
        pipe.hdel(keys.file_owner_key(stored.owner), stored.id)
        pipe.execute()

    # ---- batches ---------------------------------------------------------------------
    def create_batch(self, record: BatchRecord) -> None:
        """Store a new batch (no entries yet: the intake appends them)."""
        key = keys.batch_key(record.id)
        pipe = self.client.pipeline(transaction=True)
        pipe.hset(key, mapping={"owner": record.owner, "object": json.dumps(record.object),
                                "progress_at": record.progress_at or time.time()})
        pipe.expire(key, self.ttl_s)
        pipe.zadd(keys.BATCHES_INDEX, {record.id: time.time()})  # finer than created_at: order within a second
        pipe.execute()

    def append_entries(self, batch_id: str, entries: list[dict[str, Any]]) -> str:
        """Append the next lines' entries and stamp the progress, in one step; returns the
        batch's status as it was then (the intake stops when it is no longer ``validating``)."""
        key, list_key = keys.batch_key(batch_id), keys.batch_entries_key(batch_id)
        pipe = self.client.pipeline(transaction=True)
        if entries:
            pipe.rpush(list_key, *(json.dumps(e, ensure_ascii=False) for e in entries))
        pipe.expire(list_key, self.ttl_s)
        pipe.hset(key, "progress_at", time.time())
        pipe.hget(key, "object")
        raw = pipe.execute()[-1]
        if raw is None:
            raise NotFound(batch_id)
        return str(json.loads(raw)["status"])

    def entries(self, batch_id: str) -> list[dict[str, Any]]:
        """Every entry, in input order."""
        return [json.loads(e) for e in self.client.lrange(keys.batch_entries_key(batch_id), 0, -1)]

    def get_batch(self, batch_id: str, owner: str | None = None) -> BatchRecord:
        """The batch's object (its entries are read apart: :meth:`entries`)."""
        try:
            found_owner, raw, progress_at = self.client.hmget(keys.batch_key(batch_id),
                                                              ["owner", "object", "progress_at"])
        except keys.InvalidJobId:
            raise NotFound(batch_id) from None
        if raw is None or (owner is not None and (found_owner or "") != owner):
            raise NotFound(batch_id)
        return BatchRecord(batch_id, found_owner or "", json.loads(raw), float(progress_at or 0))

    def update(self, batch_id: str, change: Callable[[dict[str, Any]], dict[str, Any] | None]) -> BatchRecord:
        """Apply ``change`` to the batch object atomically (WATCH/MULTI, retried on a race);
        ``change`` returns ``None`` to leave it as it is (a terminal batch never changes)."""
        key = keys.batch_key(batch_id)
        for _ in range(UPDATE_RETRIES):
            with self.client.pipeline(transaction=True) as pipe:
                try:
                    pipe.watch(key)
                    raw = pipe.hget(key, "object")
                    if raw is None:
                        raise NotFound(batch_id)
                    current = json.loads(raw)
                    new = None if current["status"] in TERMINAL_BATCH_STATES else change(current)
                    if new is not None and new != current:
                        pipe.multi()
                        pipe.hset(key, "object", json.dumps(new))
                        pipe.execute()
                    break
                except redis.WatchError:
                    continue
        return self.get_batch(batch_id)

    def list_batches(self, owner: str | None, after: str | None, limit: int) -> list[BatchRecord]:
        """Newest first, after the batch ``after`` (OpenAI's cursor); expired ones are skipped."""
        ids = self.client.zrevrange(keys.BATCHES_INDEX, 0, -1)
        if after in ids:
            ids = ids[ids.index(after) + 1:]
        out: list[BatchRecord] = []
        for batch_id in ids:
            try:
                out.append(self.get_batch(batch_id, owner))
            except NotFound:
                continue
            if len(out) >= limit:
                break
        return out
