"""Property-based run of schemathesis against the app's own ``/openapi.json`` (fixed seed):
no 5xx, and every response (status, content type, headers, body) conforms to the document.

The app runs on fakeredis with a fake Celery client that plays the worker (so ``/generate``
and ``/agent/run`` finish at once). Positive and negative cases are generated: schema-valid
bodies must be accepted, schema-invalid ones rejected with a documented 4xx.
"""
from __future__ import annotations

import json
import tempfile
import time
from pathlib import Path

import fakeredis
import schemathesis
from hypothesis import HealthCheck, seed, settings
from schemathesis.specs.openapi.checks import positive_data_acceptance

from core.jobs import JobStore
from core.settings import load_settings
from core.workers import write_heartbeat
from tests.tiny_model import QWEN25_CHAT_TEMPLATE, _train_tokenizer
from tests.web.conftest import FakeCelery, run_job
from web import create_app

SEED = 20261130
API_KEY = "schemathesis-key"


def _tokenizer_dir() -> str:
    """A model folder with only what the web reads (tokenizer, chat template, context), so
    ``/tokenize`` answers instead of its documented 503 (no torch needed)."""
    folder = Path(tempfile.mkdtemp(prefix="schemathesis-tokenizer-"))
    _train_tokenizer(400).save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({"chat_template": QWEN25_CHAT_TEMPLATE}))
    (folder / "config.json").write_text(json.dumps({"max_position_embeddings": 4096}))
    return str(folder)


MODEL_DIR = _tokenizer_dir()


def _app(**overrides):
    store = JobStore(fakeredis.FakeRedis(decode_responses=True), ttl_s=600)
    celery = FakeCelery(runner=lambda job_id: run_job(store, job_id))
    # Bodies up to 64 MB are parsed, so a huge schema-violating body is judged by validation
    # (a documented 4xx), not cut off by the size guard's 413 (tested in test_jobs.py).
    settings = load_settings(cache_dir="/nonexistent/miniserve-cache", sse_keepalive_s=1, wait_timeout_s=5,
                             max_body_bytes=64 * 2**20, model=MODEL_DIR, **overrides)
    # A worker with its model loaded, fresh for the whole run: /health is ready (200).
    write_heartbeat(store.client, "w1@schemathesis", {"engine_loaded": True}, ttl_s=3600, now=time.time() + 3000)
    return create_app(settings, store=store, celery_client=celery)


open_schema = schemathesis.openapi.from_wsgi("/openapi.json", _app())
keyed_schema = schemathesis.openapi.from_wsgi("/openapi.json", _app(api_keys=[API_KEY]))
# Operations with rules between fields that JSON Schema cannot state (tool_choice must name
# one of the request's tools; tool names unique; parameters must be a valid JSON Schema):
# a schema-valid body may get a documented 400 there. The same for the generation bodies'
# structured-output fields (a guided_regex must compile, a json_schema must be a valid and
# supported schema, not on agent jobs), for ``/tokenize`` (exactly one of prompt and
# messages; tools only with messages) and ``/detokenize`` (ids below the model's vocabulary
# size). Every other check still applies.
# ``/jobs`` and ``/agent/run``: a ``deadline`` must lie ahead (and not with ``timeout_s``), a
# ``webhook_url`` must be a public http(s) target with a secret configured for the key.
# ``/v1/files``: the uploaded file must be UTF-8 text. ``/v1/completions``: best_of only 1 or n,
# echo not with suffix, prompts x n at most 64, suffix only with FIM tokens (this tokenizer has none).
# ``/api/chat``, ``/api/generate``: options in the /v1 ranges, format a valid schema and not with
# tools, system/format not with raw or suffix, suffix only with FIM tokens.
# ``/v1/embeddings``, ``/api/embed``: no empty input, and an embedding model must be served (none
# is here: a body naming no model is a 400 model_required).
CROSS_FIELD_RULES = {"/v1/chat/completions", "/v1/completions", "/v1/responses", "/api/chat", "/api/generate",
                     "/v1/messages", "/v1/messages/count_tokens",
                     "/jobs", "/generate", "/tokenize", "/detokenize",
                     "/v1/files", "/agent/run", "/v1/embeddings", "/api/embed"}
SETTINGS = dict(deadline=None, database=None, derandomize=False, suppress_health_check=list(HealthCheck))


@open_schema.parametrize()
@seed(SEED)
@settings(max_examples=40, **SETTINGS)
def test_api_conforms_to_its_openapi_document(case):
    case.call_and_validate(excluded_checks=_excluded(case))


@keyed_schema.parametrize()
@seed(SEED)
@settings(max_examples=15, **SETTINGS)
def test_api_with_keys_conforms_and_enforces_auth(case):
    case.call_and_validate(headers={"Authorization": f"Bearer {API_KEY}"}, excluded_checks=_excluded(case))


def _excluded(case) -> list:
    return [positive_data_acceptance] if case.path in CROSS_FIELD_RULES else []
