"""The monitor page is self-contained and public; its data call ``/overview`` is compact
and keyed like the rest of the API."""
from __future__ import annotations

import re

from core.events import CANCELLED
from tests.web.conftest import run_job

SHARED_ASSETS = (b"/static/common/ui.js", b"/static/common/chart.js", b"/static/common/ui.css")


def test_page_and_assets_are_served_without_a_key_and_without_cdn(make_app):
    client = make_app(api_keys=["k"]).test_client()
    page = client.get("/monitor")
    assert page.status_code == 200 and b"MiniServe monitor" in page.data
    assets = re.findall(rb'(?:src|href)="([^"]+)"', page.data)
    assert assets and not [a for a in assets if a.startswith((b"http:", b"https:", b"//"))]
    for asset in (b"/monitor/static/monitor.js", b"/monitor/static/monitor.css", *SHARED_ASSETS):
        assert asset in assets and client.get(asset.decode()).status_code == 200
    assert client.get("/overview").status_code == 401


def test_overview_has_workers_queues_and_compact_rows(client, store, celery):
    celery.runner = lambda job_id: run_job(store, job_id)
    done = client.post("/jobs", json={"prompt": "hi", "generation_method": "custom_cache"}).get_json()["id"]
    celery.runner = lambda job_id: run_job(store, job_id, state=CANCELLED,
                                           payload={"code": "cancelled", "partial": {"usage": {"completion_tokens": 2}}})
    cancelled = client.post("/jobs", json={"prompt": "hi"}).get_json()["id"]
    body = client.get("/overview").get_json()
    assert body["queues"] == {"generation": 0, "agent": 0, "bench": 0} and body["workers"] == []
    rows = {row["id"]: row for row in body["jobs"]}
    assert rows[done]["state"] == "succeeded" and rows[done]["method"] == "official"  # the worker's result says
    assert rows[done]["usage"] == {"prompt_tokens": 5, "completion_tokens": 3, "cached_tokens": 0}
    assert set(rows[done]["timings"]) >= {"ttft_s", "decode_tokens_per_s", "queue_wait_s", "job_total_s"}
    assert "request" not in rows[done] and "result" not in rows[done]
    assert rows[cancelled]["usage"] == {"completion_tokens": 2}
    assert body["counts"] == {"succeeded": 1, "cancelled": 1}
    only = client.get("/overview?state=cancelled").get_json()["jobs"]
    assert [row["id"] for row in only] == [cancelled]
    assert client.get("/overview?type=chat").get_json()["jobs"] == []
