"""``/metrics`` on fakeredis: each finished job is folded into the totals exactly once,
histograms are cumulative, worker cache statistics are counters (ratios are left to queries)."""
from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from core.events import CANCELLED, FAILED
from core.workers import write_heartbeat
from tests.web.conftest import run_job
from core.metrics_totals import fold, read_totals


def samples(client) -> dict:
    response = client.get("/metrics")
    assert response.status_code == 200
    out = {}
    for family in text_string_to_metric_families(response.data.decode()):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def get(all_samples, name, **labels):
    return all_samples.get((name, tuple(sorted(labels.items()))))


def submit(client, **body):
    return client.post("/jobs", json={"prompt": "hi", **body}).get_json()["id"]


def test_jobs_are_counted_once_by_type_and_state(client, store, celery):
    celery.runner = lambda job_id: run_job(store, job_id)
    submit(client)
    submit(client)
    celery.runner = lambda job_id: run_job(store, job_id, state=FAILED, payload={"code": "x", "message": "y"})
    submit(client)
    celery.runner = None
    queued = submit(client)
    first = samples(client)
    assert get(first, "miniserve_jobs_total", type="generate", state="succeeded") == 2
    assert get(first, "miniserve_jobs_total", type="generate", state="failed") == 1
    assert get(first, "miniserve_jobs_active", state="queued") == 1
    assert get(first, "miniserve_generated_tokens_total", type="generate") == 6
    assert get(first, "miniserve_time_to_first_token_seconds_bucket", type="generate", le="0.05") == 2
    assert get(first, "miniserve_job_latency_seconds_count", type="generate") == 3
    client.post(f"/jobs/{queued}/cancel")
    second = samples(client)
    assert get(second, "miniserve_jobs_total", type="generate", state="cancelled") == 1
    assert get(second, "miniserve_jobs_total", type="generate", state="succeeded") == 2
    assert get(second, "miniserve_jobs_active", state="queued") == 0


def test_two_folds_never_count_a_job_twice(client, store, celery, redis_client):
    celery.runner = lambda job_id: run_job(store, job_id)
    submit(client)
    fold(redis_client)
    fold(redis_client)
    assert read_totals(redis_client)["jobs|generate|succeeded"] == 1


def test_a_cancelled_jobs_partial_tokens_count(client, store, celery, redis_client):
    celery.runner = lambda job_id: run_job(store, job_id, state=CANCELLED, payload={
        "code": "cancelled", "partial": {"usage": {"completion_tokens": 4, "prompt_tokens": 2, "cached_tokens": 1}}})
    submit(client)
    all_samples = samples(client)
    assert get(all_samples, "miniserve_generated_tokens_total", type="generate") == 4
    assert get(all_samples, "miniserve_prompt_tokens_total", type="generate") == 2
    assert get(all_samples, "miniserve_cached_prompt_tokens_total", type="generate") == 1


def test_worker_cache_statistics_are_counters(client, redis_client):
    write_heartbeat(redis_client, "w1", {"current_jobs": ["a"], "cache_stats": {
        "requests": 4, "prefix_cache": {"hits": 3, "misses": 1, "entries": 2}}})
    all_samples = samples(client)
    assert get(all_samples, "miniserve_workers_online") == 1
    assert get(all_samples, "miniserve_worker_current_jobs", worker="w1") == 1
    assert get(all_samples, "miniserve_cache_lookups_total", worker="w1", cache="prefix_cache", result="hit") == 3
    assert get(all_samples, "miniserve_cache_lookups_total", worker="w1", cache="prefix_cache", result="miss") == 1
    assert not [name for name, _ in all_samples if name.endswith("_ratio")]


def test_paged_cache_blocks_and_token_lookups(client, redis_client):
    pool = {"num_blocks": 64, "blocks_used": 10, "blocks_free": 50, "blocks_cached": 4, "peak_blocks_used": 12,
            "prefix_query_tokens": 200, "prefix_hit_tokens": 50}
    write_heartbeat(redis_client, "w2", {"cache_stats": {"paged": {"running": 1, "waiting": 0, "blocks": pool}}})
    all_samples = samples(client)
    assert get(all_samples, "miniserve_cache_lookups_total", worker="w2", cache="paged", result="hit") == 50
    assert get(all_samples, "miniserve_cache_lookups_total", worker="w2", cache="paged", result="miss") == 150
    kinds = {dict(labels)["kind"]: v for (name, labels), v in all_samples.items() if name == "miniserve_kv_blocks"}
    assert kinds == {"used": 10, "free": 50, "cached": 4}  # parts only: their sum is not beside them
    assert get(all_samples, "miniserve_kv_blocks_capacity", worker="w2") == 64
