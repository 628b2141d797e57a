"""Hypothesis on the raw HTTP layer of a real ``python -m web`` (gunicorn, real Redis, a
fake worker thread that finishes every job at once): requests with fuzzed targets, bodies
and framing, the adversarial probe's cases as explicit examples. Zero 5xx, and every
error is JSON ``{"error": {"code", "message"}}`` (OpenAI's shape, with ``type``, under
``/v1/``). Bounded to well under a minute."""
from __future__ import annotations

import json
import threading
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, urlsplit

import pytest
import redis
from hypothesis import HealthCheck, example, given, seed, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer
from tokenizers.models import WordLevel
from tokenizers.pre_tokenizers import Whitespace

from core.jobs import JobStore
from tests.web.conftest import run_job
from tests.web.processes import HAVE_REDIS_SERVER, redis_server, web_server
from tests.web.raw_http import chunked, exchange, request_bytes

pytestmark = [pytest.mark.integration,
              pytest.mark.skipif(not HAVE_REDIS_SERVER, reason="redis-server not installed")]
POST_PATHS = ("/jobs", "/generate", "/agent/run", "/bench", "/v1/chat/completions")
LONE = ("\ud800", "a\udfffb", "\udc80", "\ud83d")  # lone surrogates, as JSON escapes
TAILS = ("", "/events", "/cancel", ":events", ":cancel", ":live", "%3Aevents", "/../x", "%2Fx")
FRAMINGS = ("exact", "short", "long", "negative", "huge", "garbage", "chunked", "chunked_cut")


@dataclass(frozen=True)
class Fuzzed:
    method: str
    target: str
    body: bytes
    framing: str


def _tiny_model(folder) -> str:
    """A tokenizer the web loads (so prompts are counted as with a real model), no weights."""
    folder.mkdir(parents=True, exist_ok=True)
    tokenizer = Tokenizer(WordLevel({"[UNK]": 0, "w": 1}, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = Whitespace()
    tokenizer.save(str(folder / "tokenizer.json"))
    (folder / "config.json").write_text(json.dumps({"max_position_embeddings": 4096}))
    return str(folder)


def _fake_worker(store: JobStore, stop: threading.Event) -> None:
    while not stop.wait(0.02):
        for job in store.list(state="queued", limit=50):
            try:
                run_job(store, job.id)
            except Exception:  # cancelled meanwhile: nothing to finish
                pass


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    with redis_server(tmp_path_factory.mktemp("redis")) as url:
        store = JobStore(redis.Redis.from_url(url, decode_responses=True))
        stop = threading.Event()
        worker = threading.Thread(target=_fake_worker, args=(store, stop), daemon=True)
        worker.start()
        log = tmp_path_factory.mktemp("log") / "web.log"
        model = _tiny_model(tmp_path_factory.mktemp("model") / "tiny")
        try:
            with web_server(url, tmp_path_factory.mktemp("cache"), log, MINISERVE_MODEL=model,
                            MINISERVE_BODY_TIMEOUT_S="3", MINISERVE_WAIT_TIMEOUT_S="20",
                            MINISERVE_MAX_BODY_BYTES="200000") as base:
                yield urlsplit(base).port, log
        finally:
            stop.set()
            worker.join(5)


texts = st.one_of(st.text(max_size=12), st.sampled_from(LONE), st.just("w w w"))
json_values = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | texts,
                           lambda inner: st.lists(inner, max_size=3) | st.dictionaries(texts, inner, max_size=3),
                           max_leaves=8)
messages = st.lists(st.fixed_dictionaries({"role": st.sampled_from(["user", "system", "assistant", "tool"]),
                                           "content": texts}), min_size=1, max_size=2)
bodies = st.fixed_dictionaries({}, optional={
    "prompt": texts, "messages": messages, "prefix": texts, "system": texts, "model": texts,
    "max_new_tokens": st.integers(-1, 3), "max_tokens": st.integers(1, 3), "stream": st.booleans(),
    "type": st.sampled_from(["generate", "agent"]), "benchmark": st.sampled_from(["generation_methods", "x"]),
    "stop": st.lists(texts, max_size=2), "extra": json_values})


@st.composite
def requests(draw) -> Fuzzed:
    if draw(st.booleans()):
        method, target = "POST", draw(st.sampled_from(POST_PATHS))
    else:
        job = draw(st.text(alphabet="0123456789abcdef:/%.x", max_size=40))
        method = draw(st.sampled_from(["GET", "POST"]))
        target = f"/jobs/{quote(job, safe=':/%')}{draw(st.sampled_from(TAILS))}"
    value = draw(st.one_of(bodies, json_values))
    shape = draw(st.sampled_from(["json", "json_string", "bytes"]))
    body = {"json": lambda: json.dumps(value).encode(), "json_string": lambda: json.dumps(json.dumps(value)).encode(),
            "bytes": lambda: draw(st.binary(max_size=64))}[shape]()
    return Fuzzed(method, target, body, draw(st.sampled_from(FRAMINGS)))


def wire(case: Fuzzed) -> bytes:
    headers = {"Connection": "close"}
    body, length = case.body, None
    if case.framing == "short":
        body = body[: len(body) // 2]
        length = len(case.body) or 1
    elif case.framing in ("long", "negative", "huge", "garbage"):
        length = {"long": len(body) + 10, "negative": -5, "huge": 10**30, "garbage": "12abc"}[case.framing]
    elif case.framing.startswith("chunked"):
        headers["Transfer-Encoding"] = "chunked"
        body = chunked(body, 16)
        body = body[:-7] if case.framing == "chunked_cut" else body
    return request_bytes(case.method, case.target, body, headers=headers, content_length=length)


def _check(port: int, case: Fuzzed) -> None:
    reply = exchange(port, wire(case))
    assert reply.status < 500, (case, reply.status, reply.body[:300])
    if reply.status >= 400:
        assert reply.headers.get("content-type", "").startswith("application/json"), (case, reply.headers)
        error: dict[str, Any] = reply.json()["error"]
        assert isinstance(error.get("message"), str) and error.get("code"), (case, error)


PROBE_CASES = [  # the adversarial probe's findings, each once
    Fuzzed("POST", "/jobs", json.dumps({"prompt": "x", "prefix": "\ud800"}).encode(), "exact"),
    Fuzzed("POST", "/generate", json.dumps({"prompt": "x", "system": "\ud800"}).encode(), "exact"),
    Fuzzed("POST", "/v1/chat/completions", json.dumps({"messages": [{"role": "user", "content": "\ud800"}]}).encode(),
           "exact"),
    Fuzzed("GET", "/jobs/" + "0" * 32 + ":events", b"", "exact"),
    Fuzzed("GET", "/jobs/" + "a" * 5000, b"", "exact"),
    Fuzzed("POST", "/jobs", json.dumps(json.dumps({"prompt": "x"})).encode(), "exact"),
    Fuzzed("POST", "/jobs", b'{"prompt":"x"}', "short"),
    Fuzzed("POST", "/jobs", b'{"prompt":"x"}', "negative"),
    Fuzzed("POST", "/jobs", b'{"prompt":"x"}', "huge"),
    Fuzzed("POST", "/jobs", b'{"prompt":"x"}', "chunked_cut"),
    Fuzzed("POST", "/jobs", json.dumps({"prompt": "x" * 300_000}).encode(), "chunked"),
    Fuzzed("POST", "/v1/chat/completions", json.dumps(json.dumps({"messages": [{"role": "user", "content": "x"}],
           "tools": [{"type": "function", "function": {"name": "f", "parameters": json.loads(
               '{"type": "object", "properties": {"a": ' * 150 + '{"type": "string"}' + "}}" * 150)}}]})).encode(),
           "exact"),
]


def test_the_probes_cases_get_no_5xx(served):
    port, _ = served
    for case in PROBE_CASES:
        _check(port, case)


@seed(20261201)
@settings(max_examples=250, deadline=None, database=None, derandomize=False,
          suppress_health_check=list(HealthCheck))
@example(PROBE_CASES[0])
@example(PROBE_CASES[6])
@given(case=requests())
def test_fuzzed_raw_requests_get_no_5xx_and_json_errors(served, case):
    _check(served[0], case)


def test_the_web_log_holds_no_traceback(served):
    text = served[1].read_text()
    assert "Traceback" not in text and '"status": 500' not in text
