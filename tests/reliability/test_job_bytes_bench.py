"""``python -m bench.job_bytes`` measures what it claims (on a real redis-server): the new path
keeps fewer bytes and fewer events per job than main's, and no token ids."""
from __future__ import annotations

import json

import pytest
import redis

from bench.job_bytes import measure
from core import keys

pytestmark = pytest.mark.integration


def test_job_bytes_before_and_after(redis_proc):
    _, url = redis_proc
    client = redis.Redis.from_url(url, decode_responses=True)
    client.flushall()
    rows, _ = measure(client, tokens=200, rates=[20.0], interval_s=0.1)
    row = rows[0]
    assert row["before_events"] == 202 and row["after_events"] < 120  # state + tokens + done
    assert row["after_hash_bytes"] < row["before_hash_bytes"]
    assert row["after_stream_bytes"] < row["before_stream_bytes"]
    newest = client.zrevrange(keys.JOBS_INDEX, 0, 0)[0]  # the "after" job
    assert "token_ids" not in json.loads(client.hget(keys.job_key(newest), "result"))
