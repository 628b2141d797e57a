"""docs/api.md's metrics table names every series ``/metrics`` serves, with its type, and
nothing else; no series is a ratio of counts (ratios are left to queries)."""
from __future__ import annotations

import re
from pathlib import Path

from core.workers import write_heartbeat

API_MD = Path(__file__).resolve().parents[2] / "docs" / "api.md"
ROW = re.compile(r"^\| `(miniserve_[a-z_]+)` \| (counter|gauge|histogram) \|")


def documented() -> dict[str, str]:
    text = API_MD.read_text()
    section = text[text.index("## Metrics (`GET /metrics`)"):]
    section = section[:section.index("\n## ", 1)]
    return {m.group(1): m.group(2) for line in section.splitlines() if (m := ROW.match(line))}


def served(client) -> dict[str, str]:
    text = client.get("/metrics").get_data(as_text=True)
    return {name: kind for name, kind in re.findall(r"^# TYPE (\S+) (\S+)$", text, re.MULTILINE)}


def test_the_table_lists_every_served_series(client, redis_client):
    write_heartbeat(redis_client, "w1", {"current_jobs": [], "cache_stats": {
        "prefix_cache": {"hits": 1, "misses": 1},
        "paged": {"draft_tokens": 4, "accepted_draft_tokens": 2,
                  "blocks": {"num_blocks": 8, "blocks_used": 1, "blocks_free": 7, "blocks_cached": 0,
                             "prefix_query_tokens": 4, "prefix_hit_tokens": 0}}}})
    table, series = documented(), served(client)
    assert len(table) >= 19
    assert table == series


def test_nothing_that_only_grows_is_a_gauge(client):
    for name, kind in served(client).items():
        assert not name.endswith(("_ratio", "_rate")), name
        assert kind != "gauge" or not name.endswith("_total"), name
