"""Tokens per minute per API key: a sliding window over two one-minute counters in Redis.

A job is charged what it may cost when it is accepted: its prompt's tokens plus the tokens it
may generate (``max_new_tokens`` for each choice). The window is the usual two-bucket
approximation (Cloudflare's, nginx's): the current minute's charges plus the previous
minute's, weighted by the part of it still inside the last 60 s. Checking and charging are
one script, so web processes racing on one key never admit more than the limit together.

Why charge at acceptance, not at the end: the limit is there to keep a key from filling the
queue with work; what a job really generated is known only after it ran, when the queue
already held it. A job that stops early leaves its unused tokens charged for that minute.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass

import redis

from core import keys

WINDOW_S = 60

# KEYS: this minute's counter, the previous minute's. ARGV: limit, cost, the part of the
# current minute gone (0..1), ttl. Returns {1, used after} when charged, {0, used} when not.
_CHARGE = """
local cur = tonumber(redis.call('GET', KEYS[1]) or '0')
local prev = tonumber(redis.call('GET', KEYS[2]) or '0')
local used = cur + prev * (1 - tonumber(ARGV[3]))
local cost = tonumber(ARGV[2])
if used + cost > tonumber(ARGV[1]) then return {0, tostring(used)} end
redis.call('INCRBY', KEYS[1], cost)
redis.call('EXPIRE', KEYS[1], ARGV[4])
return {1, tostring(used + cost)}
"""


@dataclass(frozen=True)
class Charge:
    admitted: bool
    used: float          # tokens counted in the last minute (with this charge, when admitted)
    retry_after_s: int   # when not admitted: until the current minute ends, when its share rolls off


class TokenRate:
    def __init__(self, client: redis.Redis, limit: int) -> None:
        self.client, self.limit = client, limit
        self._charge = client.register_script(_CHARGE)

    def charge(self, owner: str, cost: int, now: float | None = None) -> Charge:
        now = time.time() if now is None else now
        minute, gone = divmod(now, WINDOW_S)
        reply = self._charge(keys=[keys.token_rate_key(owner, int(minute)), keys.token_rate_key(owner, int(minute) - 1)],
                             args=[self.limit, cost, repr(gone / WINDOW_S), 2 * WINDOW_S])
        admitted, used = bool(int(reply[0])), float(reply[1])
        return Charge(admitted, used, 0 if admitted else max(1, math.ceil(WINDOW_S - gone)))
