"""``/metrics`` of the running service parses with prometheus-client's parser, and its
counters and histograms move after a job.

The package's stack is shared: a job an earlier test left running (a page's chat, say) could
end between the two scrapes and count twice, so the test starts once no job is unfinished."""
from __future__ import annotations

import requests
from prometheus_client.parser import text_string_to_metric_families

from core.events import TERMINAL_STATES
from tests.harness.stack import wait_until


def scrape(base_url: str) -> dict[tuple[str, tuple], float]:
    response = requests.get(f"{base_url}/metrics", timeout=10)
    assert response.status_code == 200 and response.headers["Content-Type"].startswith("text/plain")
    samples = {}
    for family in text_string_to_metric_families(response.text):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


def value(samples, name: str, **labels) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def _no_unfinished_job(store) -> bool:
    return all(job.is_terminal for job in store.list(limit=1000))


def test_counters_move_after_a_job(base_url, surface_store):
    wait_until(lambda: _no_unfinished_job(surface_store), 60, what="the earlier tests' jobs to end")
    before = scrape(base_url)
    assert value(before, "miniserve_workers_online") == 1
    assert value(before, "miniserve_queue_depth", queue="generation") == 0
    response = requests.post(f"{base_url}/v1/chat/completions", timeout=60,
                             json={"messages": [{"role": "user", "content": "Hi there"}], "max_tokens": 6})
    assert response.status_code == 200
    generated = response.json()["usage"]["completion_tokens"]
    job_id = response.headers["X-Job-Id"]
    wait_until(lambda: surface_store.get(job_id).state in TERMINAL_STATES, 10, what="job end")
    after = scrape(base_url)
    key = dict(type="chat", state="succeeded")
    assert value(after, "miniserve_jobs_total", **key) == value(before, "miniserve_jobs_total", **key) + 1
    assert value(after, "miniserve_generated_tokens_total", type="chat") == \
        value(before, "miniserve_generated_tokens_total", type="chat") + generated
    for hist in ("miniserve_time_to_first_token_seconds", "miniserve_job_latency_seconds"):
        assert value(after, f"{hist}_count", type="chat") == value(before, f"{hist}_count", type="chat") + 1
        assert value(after, f"{hist}_bucket", type="chat", le="+Inf") == value(after, f"{hist}_count", type="chat")
    assert scrape(base_url)[("miniserve_jobs_total", tuple(sorted(key.items())))] == \
        value(after, "miniserve_jobs_total", **key)  # a second scrape does not count the job again
