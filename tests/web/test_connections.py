"""The connections benchmark, small: 300 held SSE streams, 30 cycling ones and 30 slowloris
sockets against a real ``python -m web`` (gevent workers) and redis-server, with the fake
worker of :mod:`bench.load_connections`. Under the old gthread model (2 x 64 threads) the
held streams alone took every thread and ``/healthz`` timed out. The tests assert what the web
decides (every stream served once, every probe answered, every dripping socket cut by the
server); how fast is the benchmark's to report (``python -m bench.load_connections``)."""
from __future__ import annotations

import math

import pytest

from bench.load_connections import ConnectionRun, measure
from tests.web.processes import HAVE_REDIS_SERVER

pytestmark = [pytest.mark.integration,
              pytest.mark.skipif(not HAVE_REDIS_SERVER, reason="redis-server not installed")]


@pytest.fixture(scope="module")
def summary(tmp_path_factory):
    run = ConnectionRun(connections=300, slowloris=30, running_jobs=10, loaded_s=12, unloaded_s=2,
                        web_workers=1, output=str(tmp_path_factory.mktemp("out") / "connections"))
    return measure(run)


def test_every_held_stream_opened_and_got_every_event_once(summary):
    subs = summary["subscribers"]
    assert summary["peak_open"]["held"] == subs["held"] == 300
    assert subs["held_not_200"] == subs["held_lost"] == subs["held_duplicated_events"] == 0
    assert subs["cycling_streams"] > subs["cycling"] and subs["cycling_incomplete"] == 0


def test_health_and_new_jobs_are_answered_under_the_load(summary):
    health, ttft = summary["health"]["loaded"], summary["ttft"]["loaded"]
    assert health["errors"] == 0 and health["n"] > 0, summary["load_phase_machine"]
    assert ttft["errors"] == 0 and ttft["n"] > 0


def test_slowloris_sockets_are_dropped_at_their_deadlines(summary):
    headers, body = summary["slowloris"]["header_drip"], summary["slowloris"]["body_drip"]
    assert headers["dropped_by_server"] >= headers["sockets"]
    assert body["dropped_by_server"] >= body["sockets"]
    assert set(body["answers"]) <= {400} and not math.isnan(body["longest_held_s"])
