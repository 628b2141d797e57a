"""The connections benchmark, small: 300 held SSE streams, 30 cycling ones and 30 slowloris
sockets against a real ``python -m web`` (gevent workers) and redis-server, with the fake
worker of :mod:`bench.load_connections`. Under the old gthread model (2 x 64 threads) the
held streams alone took every thread and ``/healthz`` timed out. Bounded to about 45 s."""
from __future__ import annotations

import math

import pytest

from bench.load_connections import WEB_CLOCKS, ConnectionRun, measure
from tests.web.processes import HAVE_REDIS_SERVER

pytestmark = [pytest.mark.integration,
              pytest.mark.skipif(not HAVE_REDIS_SERVER, reason="redis-server not installed")]
CI_HEALTH_P99_MS = 500  # the benchmark's target is 100 ms on an idle machine; CI machines are shared
SLACK_S = 6  # scheduling on a busy machine, the client's one-second drip, the accept backlog


@pytest.fixture(scope="module")
def summary(tmp_path_factory):
    run = ConnectionRun(connections=300, slowloris=30, running_jobs=10, loaded_s=15, unloaded_s=5,
                        web_workers=1, output=str(tmp_path_factory.mktemp("out") / "connections"))
    return measure(run)


def test_every_held_stream_opened_and_got_every_event_once(summary):
    subs = summary["subscribers"]
    assert summary["peak_open"]["held"] == subs["held"] == 300
    assert subs["held_not_200"] == subs["held_lost"] == subs["held_duplicated_events"] == 0
    assert subs["cycling_streams"] > subs["cycling"] and subs["cycling_incomplete"] == 0


def test_health_and_new_jobs_stay_fast_under_the_load(summary):
    health, ttft = summary["health"]["loaded"], summary["ttft"]["loaded"]
    assert health["errors"] == 0 and health["n"] > 50
    assert health["p99_ms"] < CI_HEALTH_P99_MS, summary["load_phase_machine"]  # says whether the web was starved
    unloaded = summary["ttft"]["unloaded"]["p50_ms"]
    assert ttft["errors"] == 0 and ttft["n"] >= 5
    assert ttft["p50_ms"] < max(2 * unloaded, unloaded + 250)


def test_slowloris_sockets_are_dropped_at_their_deadlines(summary):
    headers, body = summary["slowloris"]["header_drip"], summary["slowloris"]["body_drip"]
    header_s, body_s = int(WEB_CLOCKS["MINISERVE_HEADER_TIMEOUT_S"]), int(WEB_CLOCKS["MINISERVE_BODY_DEADLINE_S"])
    assert headers["dropped_by_server"] >= headers["sockets"] and headers["longest_held_s"] < header_s + SLACK_S
    assert body["dropped_by_server"] >= body["sockets"] and body["longest_held_s"] < body_s + SLACK_S
    assert set(body["answers"]) <= {400} and not math.isnan(body["longest_held_s"])
