"""Per-key quotas on stored files (count and bytes), checked and reserved in one Redis step.

Why a script: two uploads of one key racing must not both pass a check that only one of
them fits. The owner's hash maps each file id to "bytes:created_at"; a file that no longer
exists (deleted, or expired with the job TTL) stops counting, but only after a grace period,
so a reservation whose file is still being written is not pruned by a concurrent upload.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import redis

from core import keys

RESERVE_GRACE_S = 60  # a reserved id without its file yet still counts this long

_RESERVE = """
local entries = redis.call('HGETALL', KEYS[1])
local now, grace = tonumber(ARGV[4]), tonumber(ARGV[6])
local count, total = 0, 0
for i = 1, #entries, 2 do
  local sep = string.find(entries[i + 1], ':')
  local size = tonumber(string.sub(entries[i + 1], 1, sep - 1))
  local born = tonumber(string.sub(entries[i + 1], sep + 1))
  if redis.call('EXISTS', ARGV[5] .. entries[i]) == 1 or now - born < grace then
    count = count + 1
    total = total + size
  else
    redis.call('HDEL', KEYS[1], entries[i])
  end
end
if count + 1 > tonumber(ARGV[1]) then return {-1, count, total} end
if total + tonumber(ARGV[3]) > tonumber(ARGV[2]) then return {-2, count, total} end
redis.call('HSET', KEYS[1], ARGV[7], ARGV[3] .. ':' .. ARGV[4])
redis.call('EXPIRE', KEYS[1], ARGV[8])
return {1, count + 1, total + tonumber(ARGV[3])}
"""


class QuotaExceeded(Exception):
    """This key already holds as many files, or as many bytes, as it may."""

    def __init__(self, what: str, limit: int, held: int) -> None:
        super().__init__(f"{what}: this key holds {held} of {limit}")
        self.what, self.limit, self.held = what, limit, held


@dataclass
class FileQuota:
    client: redis.Redis
    max_files: int
    max_bytes: int
    ttl_s: int

    def reserve(self, owner: str, file_id: str, size: int) -> None:
        """Count ``size`` bytes under ``file_id`` for ``owner``, or raise :class:`QuotaExceeded`."""
        script = self.client.register_script(_RESERVE)
        ok, count, total = script(keys=[keys.file_owner_key(owner)],
                                  args=[self.max_files, self.max_bytes, size, int(time.time()),
                                        keys.FILE_KEY_PREFIX, RESERVE_GRACE_S, file_id, self.ttl_s])
        if ok == -1:
            raise QuotaExceeded("files", self.max_files, int(count))
        if ok == -2:
            raise QuotaExceeded("bytes", self.max_bytes, int(total))

    def release(self, owner: str, file_id: str) -> None:
        self.client.hdel(keys.file_owner_key(owner), file_id)
