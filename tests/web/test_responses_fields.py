"""Every field of OpenAI's Responses request is honoured, accepted without effect, or refused
with a 400 naming it; unknown fields are refused (``web.openai.responses_fields``).

``OPENAI_RESPONSE_FIELDS`` is the ``openai`` client's own request type
(``ResponseCreateParamsBase`` plus ``stream``); a test checks it against the installed
client, so an upgrade that adds a field fails here until the field is classified."""
from __future__ import annotations

import json
import re
import typing
from pathlib import Path

import pytest

from core.model_source import DEFAULT_MODEL_NAME
from core.workers import write_heartbeat
from tests.web.test_responses_api import WEATHER, says
from web.openai.responses_fields import RESPONSE_FIELDS
from web.openai.responses_schemas import ResponseRequest

OPENAI_RESPONSE_FIELDS = (
    "access_programs", "background", "background_options", "context_management", "conversation", "image",
    "include", "input", "instructions", "max_output_tokens", "max_tool_calls", "metadata", "model",
    "moderation", "parallel_tool_calls", "previous_response_id", "prompt", "prompt_cache_key",
    "prompt_cache_options", "prompt_cache_retention", "reasoning", "safety_identifier", "service_tier",
    "store", "stream", "stream_options", "temperature", "text", "tool_choice", "tools", "top_logprobs",
    "top_p", "truncation", "user",
)
INPUT = "What is the weather in Paris?"
# honoured: (body without the field, body with it); the stored job or the answer must differ
HONOURED = {
    "input": ({}, {"input": "Something else"}),
    "instructions": ({}, {"instructions": "Be brief."}),
    "model": ({}, {"model": "another-model"}),
    "max_output_tokens": ({}, {"max_output_tokens": 7}),
    "temperature": ({}, {"temperature": 0.5}),
    "top_p": ({}, {"top_p": 0.5}),
    "stream": ({}, {"stream": True}),
    "tools": ({}, {"tools": [WEATHER]}),
    "tool_choice": ({"tools": [WEATHER]}, {"tools": [WEATHER], "tool_choice": "required"}),
    "parallel_tool_calls": ({"tools": [WEATHER], "tool_choice": "required"},
                            {"tools": [WEATHER], "tool_choice": "required", "parallel_tool_calls": False}),
    "text": ({}, {"text": {"format": {"type": "json_object"}}}),
    "store": ({}, {"store": False}),
    "previous_response_id": ({}, {"previous_response_id": "<first>"}),
    "background": ({}, {"background": True}),
}
NO_EFFECT = {"user": "u-1", "safety_identifier": "s-1", "metadata": {"k": "v"}, "service_tier": "flex",
             "prompt_cache_key": "k", "prompt_cache_retention": "24h", "prompt_cache_options": {"mode": "explicit"},
             "stream_options": {"include_obfuscation": False}}
# refused: (a value that would change the answer, the default value that is accepted)
REFUSED = {
    "include": (["message.output_text.logprobs"], []), "top_logprobs": (3, 0),
    "truncation": ("auto", "disabled"), "reasoning": ({"effort": "low"}, None), "max_tool_calls": (2, None),
    "conversation": ("conv_1", None), "context_management": ([{"type": "compaction"}], None),
    "prompt": ({"id": "pmpt_1"}, None), "moderation": ({"policy": {}}, None), "image": ({"size": "auto"}, None),
    "background_options": ({"x": 1}, None), "access_programs": ({"x": 1}, None),
}


def test_the_list_is_the_installed_clients():
    from openai.types.responses import response_create_params as params
    assert set(OPENAI_RESPONSE_FIELDS) == set(typing.get_type_hints(params.ResponseCreateParamsBase)) | {"stream"}


def test_every_field_is_classified_once():
    extensions = {name for name, rule in RESPONSE_FIELDS.items() if rule.extension}
    assert set(RESPONSE_FIELDS) - extensions == set(OPENAI_RESPONSE_FIELDS)
    assert set(ResponseRequest.model_fields) <= set(RESPONSE_FIELDS)
    by_kind = {kind: {n for n in OPENAI_RESPONSE_FIELDS if RESPONSE_FIELDS[n].kind == kind}
               for kind in ("honoured", "no_effect", "refused")}
    assert by_kind == {"honoured": set(HONOURED), "no_effect": set(NO_EFFECT), "refused": set(REFUSED)}


def fingerprint(client, job_store, **body) -> tuple:
    """What a request produced: the stored job request and the answer (ids and clocks out)."""
    response = client.post("/v1/responses", json={"input": INPUT, **body})
    assert response.status_code == 200, response.get_json()
    job_id = response.headers["X-Job-Id"]
    text = re.sub(r'"(created_at|completed_at)": ?[0-9.]+', "", response.get_data(as_text=True).replace(job_id, "<job>"))
    stored = job_store.get(job_id).request
    return json.dumps(stored, sort_keys=True), response.mimetype, text


@pytest.mark.parametrize("name", sorted(HONOURED))
def test_an_honoured_field_changes_the_job_or_the_answer(client, store, celery, name):
    says(store, celery, "Hello there")
    for worker, model in (("a@h:1", DEFAULT_MODEL_NAME), ("b@h:1", "another-model")):
        write_heartbeat(store.client, worker, {"model_id": model})
    without, with_field = HONOURED[name]
    if with_field.get("previous_response_id") == "<first>":
        first = client.post("/v1/responses", json={"input": "Hi"}).get_json()
        with_field = {"previous_response_id": first["id"]}
    assert fingerprint(client, store, **without) != fingerprint(client, store, **with_field)


@pytest.mark.parametrize("name", sorted(NO_EFFECT))
def test_a_no_effect_field_changes_nothing(client, store, celery, name):
    says(store, celery, "Hello there")
    assert fingerprint(client, store) == fingerprint(client, store, **{name: NO_EFFECT[name]})


@pytest.mark.parametrize("name", sorted(NO_EFFECT))
def test_a_no_effect_field_is_still_type_checked(client, name):
    response = client.post("/v1/responses", json={"input": INPUT, name: 12345})
    assert response.status_code == 400 and response.get_json()["error"]["param"] == name


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_a_refused_field_is_a_400_naming_it(client, store, celery, name):
    says(store, celery, "Hello there")
    bad, default = REFUSED[name]
    response = client.post("/v1/responses", json={"input": INPUT, name: bad})
    error = response.get_json()["error"]
    assert response.status_code == 400 and error["param"] == name and "not supported" in error["message"]
    accepted = client.post("/v1/responses", json={"input": INPUT, name: default})
    assert accepted.status_code == 200, accepted.get_json()


def test_docs_api_table_is_the_code_table():
    text = (Path(__file__).resolve().parents[2] / "docs" / "api.md").read_text()
    section = text[text.index("### `POST /v1/responses`: every request field"):]
    section = section[:section.index("\n### ", 1)]
    rows = dict(re.findall(r"^\| `([a-z_]+)` \| (honoured|no_effect|refused) \|", section, re.MULTILINE))
    assert rows == {name: rule.kind for name, rule in RESPONSE_FIELDS.items()}
