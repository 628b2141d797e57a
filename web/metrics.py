"""``GET /metrics``: Prometheus text, computed from Redis at scrape time.

A collector on the app's own ``CollectorRegistry`` reads everything when scraped: job
totals and latency histograms (folded in from finished jobs, see
:mod:`core.metrics_totals`), queue depths, jobs waiting and running, workers online and
each worker's cache counters from its heartbeat. Nothing is counted in the web process,
so any gunicorn process answers the same numbers.
"""
from __future__ import annotations

from typing import Any, Iterator

from flask import Response, current_app
from flask_openapi3 import APIBlueprint, OpenAPI, Tag
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric

from core.jobs import JobStore
from core.settings import Settings
from core.routing import counts as routing_counts, waiting as routing_waiting
from core.workers import list_workers
from web.context import EXTENSION_KEY
from core.metrics_totals import HISTOGRAMS, fold, read_totals
from web.routes_jobs import GUARD_ERRORS

api = APIBlueprint("metrics", __name__, abp_tags=[Tag(name="system", description="service status")])
METRICS_RESPONSE = {"description": "Prometheus text exposition format",
                    "content": {"text/plain": {"schema": {"type": "string"}}}}
REGISTRY_KEY = "miniserve_metrics_registry"
TOKEN_KINDS = {"completion_tokens": ("miniserve_generated_tokens", "Tokens generated"),
               "prompt_tokens": ("miniserve_prompt_tokens", "Prompt tokens read"),
               "cached_tokens": ("miniserve_cached_prompt_tokens", "Prompt tokens served from a cache"),
               "draft_tokens": ("miniserve_speculative_draft_tokens", "Speculative draft tokens verified"),
               "accepted_draft_tokens": ("miniserve_speculative_accepted_tokens",
                                         "Speculative draft tokens accepted")}


class RedisCollector:
    """Reads the whole picture from Redis on every scrape."""

    def __init__(self, store: JobStore, settings: Settings) -> None:
        self.store, self.settings = store, settings

    def collect(self) -> Iterator[Metric]:
        client = self.store.client
        window = fold(client)
        totals = read_totals(client)
        yield from _job_counters(totals)
        yield from _histograms(totals)
        yield from _token_counters(totals)
        active = GaugeMetricFamily("miniserve_jobs_active", "Jobs queued or running now", labels=["state"])
        for state in ("queued", "running"):
            active.add_metric([state], window.active.get(state, 0))
        yield active
        depth = GaugeMetricFamily("miniserve_queue_depth", "Messages waiting in each Celery queue", labels=["queue"])
        for queue, n in self.store.queue_depths().items():
            depth.add_metric([queue], n)
        yield depth
        workers = list_workers(client, self.settings.worker_max_age_s)
        yield from _worker_metrics(workers)
        waiting = GaugeMetricFamily("miniserve_worker_queue_depth", "Jobs routed to a worker's own queue, "
                                    "waiting", labels=["worker"])
        for name, n in routing_waiting(client, workers).items():
            waiting.add_metric([name], n)
        yield waiting
        decisions = CounterMetricFamily("miniserve_routing_decisions", "Where the web sent generation jobs: "
                                        "routed = to the worker holding the prompt's prefix", labels=["decision"])
        for reason, n in routing_counts(client).items():
            decisions.add_metric([reason], n)
        yield decisions


def _job_counters(totals: dict[str, float]) -> Iterator[Metric]:
    jobs = CounterMetricFamily("miniserve_jobs", "Jobs that ended, by type and terminal state",
                               labels=["type", "state"])
    for field_name, value in sorted(totals.items()):
        family, *labels = field_name.split("|")
        if family == "jobs" and len(labels) == 2:
            jobs.add_metric(labels, value)
    yield jobs


def _token_counters(totals: dict[str, float]) -> Iterator[Metric]:
    families = {kind: CounterMetricFamily(name, doc, labels=["type"]) for kind, (name, doc) in TOKEN_KINDS.items()}
    for field_name, value in sorted(totals.items()):
        family, *labels = field_name.split("|")
        if family == "tokens" and len(labels) == 2 and labels[1] in families:
            families[labels[1]].add_metric([labels[0]], value)
    yield from families.values()


def _histograms(totals: dict[str, float]) -> Iterator[Metric]:
    names = {"ttft": ("miniserve_time_to_first_token_seconds", "Time to first token of generation jobs"),
             "latency": ("miniserve_job_latency_seconds", "Job total latency, created to finished")}
    for family, buckets in HISTOGRAMS.items():
        name, doc = names[family]
        metric = HistogramMetricFamily(name, doc, labels=["type"])
        types = sorted({k.split("|")[1] for k in totals if k.startswith(f"{family}|")})
        for job_type in types:
            cumulative, rows = 0.0, []
            for le in [repr(b) for b in buckets] + ["+Inf"]:
                cumulative += totals.get(f"{family}|{job_type}|{le}", 0.0)
                rows.append((le, cumulative))
            metric.add_metric([job_type], rows, sum_value=totals.get(f"{family}|{job_type}|sum", 0.0))
        yield metric


def _worker_metrics(workers: list[dict[str, Any]]) -> Iterator[Metric]:
    """Per-worker series from the heartbeats. Cache and draft figures are counts since the
    worker started, so they are counters (a restart is a reset, which ``rate()`` handles);
    ratios are left to queries (docs/api.md shows them)."""
    online = GaugeMetricFamily("miniserve_workers_online", "Workers with a recent heartbeat")
    online.add_metric([], len(workers))
    yield online
    busy = GaugeMetricFamily("miniserve_worker_current_jobs", "Jobs each worker runs now", labels=["worker"])
    lookups = CounterMetricFamily("miniserve_cache_lookups", "Cache lookups since the worker started (prefix "
                                  "cache: requests; paged: prompt tokens)", labels=["worker", "cache", "result"])
    blocks = GaugeMetricFamily("miniserve_kv_blocks", "KV blocks of the paged cache by use (the kinds add up "
                               "to the capacity)", labels=["worker", "kind"])
    capacity = GaugeMetricFamily("miniserve_kv_blocks_capacity", "KV blocks in the paged pool", labels=["worker"])
    drafted = CounterMetricFamily("miniserve_worker_speculative_draft_tokens", "Speculative draft tokens "
                                  "verified since the worker started", labels=["worker"])
    accepted = CounterMetricFamily("miniserve_worker_speculative_accepted_tokens", "Speculative draft tokens "
                                   "accepted since the worker started", labels=["worker"])
    for worker in workers:
        name, info = worker["name"], worker.get("info") or {}
        busy.add_metric([name], len(info.get("current_jobs") or []))
        n_drafted, n_accepted = draft_totals(info.get("cache_stats") or {})
        if n_drafted:
            drafted.add_metric([name], n_drafted)
            accepted.add_metric([name], n_accepted)
        for cache, stats in (info.get("cache_stats") or {}).items():
            figures = cache_figures(stats)
            if figures is None:
                continue
            hits, misses, pool = figures
            lookups.add_metric([name, cache, "hit"], hits)
            lookups.add_metric([name, cache, "miss"], misses)
            for kind in ("used", "free", "cached"):
                if f"blocks_{kind}" in pool:
                    blocks.add_metric([name, kind], float(pool[f"blocks_{kind}"]))
            if "num_blocks" in pool:
                capacity.add_metric([name], float(pool["num_blocks"]))
    yield from (busy, lookups, blocks, capacity, drafted, accepted)


def draft_totals(cache_stats: dict[str, Any]) -> tuple[float, float]:
    """(drafted, accepted) speculative tokens over a heartbeat's engine parts (the solo
    methods' ``speculative`` counters and the paged scheduler's)."""
    drafted = accepted = 0.0
    for stats in cache_stats.values():
        if isinstance(stats, dict) and "draft_tokens" in stats and "accepted_draft_tokens" in stats:
            drafted += float(stats["draft_tokens"])
            accepted += float(stats["accepted_draft_tokens"])
    return drafted, accepted


def cache_figures(stats: Any) -> tuple[float, float, dict[str, Any]] | None:
    """(hits, misses, block pool) of one cache in a worker's heartbeat: the prefix cache
    counts requests (``hits``/``misses``); the paged cache counts prompt tokens found in
    its block pool (``blocks.prefix_hit_tokens`` of ``blocks.prefix_query_tokens``)."""
    if not isinstance(stats, dict):
        return None
    if "hits" in stats and "misses" in stats:
        return float(stats["hits"]), float(stats["misses"]), {}
    pool = stats.get("blocks")
    if isinstance(pool, dict) and "prefix_query_tokens" in pool:
        hits = float(pool.get("prefix_hit_tokens", 0))
        return hits, float(pool["prefix_query_tokens"]) - hits, pool
    return None


@api.get("/metrics", summary="Prometheus metrics (jobs, latencies, tokens, queues, workers, caches)",
         responses={200: METRICS_RESPONSE, **GUARD_ERRORS})
def metrics():
    # The classic text format (0.0.4), which every Prometheus version reads.
    return Response(generate_latest(current_app.extensions[REGISTRY_KEY]), content_type=CONTENT_TYPE_PLAIN_0_0_4)


def register(app: OpenAPI) -> None:
    registry = CollectorRegistry(auto_describe=False)
    web = app.extensions[EXTENSION_KEY]
    registry.register(RedisCollector(web.store, web.settings))
    app.extensions[REGISTRY_KEY] = registry
    app.register_api(api)
