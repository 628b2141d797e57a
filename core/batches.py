"""Files and batches of OpenAI's Batch API, kept in Redis with the job TTL.

A batch is an OpenAI ``batch`` object plus its *entries*: one per input line, either the
job the line became (``{"custom_id", "job_id", "body"}``) or the error that stopped it
(``{"custom_id", "error": {...}}``). Nothing else is stored: progress and the output file
are read from the jobs themselves (``web.openai.batch_output``), so a worker killed
mid-batch (its job is re-run by the reaper) or a restarted web changes nothing.

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
    entries: list[dict[str, Any]]

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

    def get_file(self, file_id: str, owner: str | None = None) -> StoredFile:
        try:
            raw = self.client.hgetall(keys.file_key(file_id))
        except keys.InvalidJobId:
            raise NotFound(file_id) from None
        if not raw or "purpose" not in raw or (owner is not None and raw.get("owner", "") != owner):
            raise NotFound(file_id)
        return StoredFile(file_id, raw["purpose"], raw.get("filename", ""), int(raw["created_at"]),
                          raw.get("owner", ""), raw.get("content", ""))

    def delete_file(self, file_id: str, owner: str | None = None) -> None:
        """Remove a file (its owner's quota frees with it: the quota counts existing files)."""
        stored = self.get_file(file_id, owner)
        pipe = self.client.pipeline(transaction=True)
        pipe.delete(keys.file_key(stored.id))
        pipe.zrem(keys.FILES_INDEX, stored.id)
        pipe.hdel(keys.file_owner_key(stored.owner), stored.id)
        pipe.execute()

    # ---- batches ---------------------------------------------------------------------
    def create_batch(self, record: BatchRecord) -> None:
        key = keys.batch_key(record.id)
        pipe = self.client.pipeline(transaction=True)
        pipe.hset(key, mapping={"owner": record.owner, "object": json.dumps(record.object),
                                "entries": json.dumps(record.entries, ensure_ascii=False)})
        pipe.expire(key, self.ttl_s)
        pipe.zadd(keys.BATCHES_INDEX, {record.id: time.time()})  # finer than created_at: order within a second
        pipe.execute()

    def set_entries(self, batch_id: str, entries: list[dict[str, Any]], changes: dict[str, Any]) -> BatchRecord:
        """The lines' jobs and errors, written once when the input has been read, with the
        object changes that go with them (``validating`` -> ``in_progress``)."""
        self.client.hset(keys.batch_key(batch_id), "entries", json.dumps(entries, ensure_ascii=False))
        return self.update(batch_id, lambda obj: {**obj, **changes})

    def get_batch(self, batch_id: str, owner: str | None = None) -> BatchRecord:
        try:
            raw = self.client.hgetall(keys.batch_key(batch_id))
        except keys.InvalidJobId:
            raise NotFound(batch_id) from None
        if not raw or (owner is not None and raw.get("owner", "") != owner):
            raise NotFound(batch_id)
        return BatchRecord(batch_id, raw.get("owner", ""), json.loads(raw["object"]), json.loads(raw["entries"]))

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
