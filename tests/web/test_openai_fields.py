"""Every field of OpenAI's chat request is honoured, accepted without effect, or refused
with a 400 naming it; unknown fields are refused (``web.openai.fields.CHAT_FIELDS``).

``OPENAI_CHAT_FIELDS`` is written from the ``openai`` client's own request type
(``openai/types/chat/completion_create_params.py``, ``CompletionCreateParamsBase`` plus
``stream``); a test checks it against the installed client, so an upgrade that adds a field
fails here until the field is classified."""
from __future__ import annotations

import json
import re
import typing

import pytest

from core.model_source import DEFAULT_MODEL_NAME
from core.workers import write_heartbeat
from tests.web.test_openai_api import USER, WEATHER_TOOL, worker_says
from web.openai.fields import CHAT_FIELDS
from web.openai.schemas import ChatCompletionRequest

OPENAI_CHAT_FIELDS = (
    "audio", "frequency_penalty", "function_call", "functions", "logit_bias", "logprobs",
    "max_completion_tokens", "max_tokens", "messages", "metadata", "modalities", "model", "moderation",
    "n", "parallel_tool_calls", "prediction", "presence_penalty", "prompt_cache_key", "prompt_cache_options",
    "prompt_cache_retention", "reasoning_effort", "response_format", "safety_identifier", "seed",
    "service_tier", "stop", "store", "stream", "stream_options", "temperature", "tool_choice", "tools",
    "top_logprobs", "top_p", "user", "verbosity", "web_search_options",
)
# honoured: (body without the field, body with it); the answer or the stored job must differ
HONOURED = {
    "messages": ({}, {"messages": [{"role": "user", "content": "Something else"}]}),
    "max_completion_tokens": ({}, {"max_completion_tokens": 7}),
    "max_tokens": ({}, {"max_tokens": 7}),
    "temperature": ({}, {"temperature": 0.5}),
    "top_p": ({}, {"top_p": 0.5}),
    "seed": ({}, {"seed": 3}),
    "stop": ({}, {"stop": "x"}),
    "stream": ({}, {"stream": True}),
    "stream_options": ({"stream": True}, {"stream": True, "stream_options": {"include_usage": True}}),
    "tools": ({}, {"tools": [WEATHER_TOOL]}),
    "tool_choice": ({"tools": [WEATHER_TOOL]}, {"tools": [WEATHER_TOOL], "tool_choice": "required"}),
    "parallel_tool_calls": ({"tools": [WEATHER_TOOL], "tool_choice": "required"},
                            {"tools": [WEATHER_TOOL], "tool_choice": "required", "parallel_tool_calls": False}),
    "response_format": ({}, {"response_format": {"type": "json_object"}}),
    "presence_penalty": ({}, {"presence_penalty": 0.5}),
    "frequency_penalty": ({}, {"frequency_penalty": -1.0}),
    "logit_bias": ({}, {"logit_bias": {"42": -100}}),
    "logprobs": ({}, {"logprobs": True}),
    "n": ({}, {"n": 2}),
    "top_logprobs": ({"logprobs": True}, {"logprobs": True, "top_logprobs": 2}),
    "model": ({}, {"model": "another-model"}),  # both served (heartbeats below): the job names its model
}
NO_EFFECT = {"user": "u-1", "safety_identifier": "s-1", "metadata": {"k": "v"},
             "service_tier": "flex", "prompt_cache_key": "k", "prompt_cache_retention": "24h",
             "prompt_cache_options": {"mode": "explicit"}}
# refused: (a value that would change the answer, the default value that is accepted)
REFUSED = {
    "store": (True, False), "modalities": (["text", "audio"], ["text"]),
    "audio": ({"voice": "alloy", "format": "mp3"}, None), "prediction": ({"type": "content", "content": "x"}, None),
    "web_search_options": ({}, None), "functions": ([{"name": "f"}], None), "function_call": ("auto", None),
    "reasoning_effort": ("low", None), "verbosity": ("low", None), "moderation": ({"policy": {}}, None),
}


def test_the_list_is_the_installed_clients():
    from openai.types.chat import completion_create_params as params
    installed = set(typing.get_type_hints(params.CompletionCreateParamsBase)) | {"stream"}
    assert set(OPENAI_CHAT_FIELDS) == installed


def test_every_field_is_classified_once():
    assert set(OPENAI_CHAT_FIELDS) <= set(CHAT_FIELDS)
    extensions = {name for name, rule in CHAT_FIELDS.items() if rule.extension}
    assert set(CHAT_FIELDS) - extensions == set(OPENAI_CHAT_FIELDS)  # nothing invented as OpenAI's
    assert set(ChatCompletionRequest.model_fields) <= set(CHAT_FIELDS)
    by_kind = {kind: {n for n in OPENAI_CHAT_FIELDS if CHAT_FIELDS[n].kind == kind}
               for kind in ("honoured", "no_effect", "refused")}
    assert by_kind == {"honoured": set(HONOURED), "no_effect": set(NO_EFFECT), "refused": set(REFUSED)}


def fingerprint(client, store, **body) -> tuple:
    """What a request produced: the stored job request and the answer (ids and clocks out)."""
    response = client.post("/v1/chat/completions", json={"messages": USER, **body})
    assert response.status_code == 200, response.get_json()
    job_id = response.headers["X-Job-Id"]
    text = re.sub(r'"created": ?\d+', "", response.get_data(as_text=True).replace(job_id, "<job>"))
    return json.dumps(store.get(job_id).request, sort_keys=True), response.mimetype, text


@pytest.mark.parametrize("name", sorted(HONOURED))
def test_an_honoured_field_changes_the_job_or_the_answer(client, store, celery, name):
    worker_says(store, celery, "Hello there")
    for worker, model in (("a@h:1", DEFAULT_MODEL_NAME), ("b@h:1", "another-model")):
        write_heartbeat(store.client, worker, {"model_id": model})
    without, with_field = HONOURED[name]
    assert fingerprint(client, store, **without) != fingerprint(client, store, **with_field)


@pytest.mark.parametrize("name", sorted(NO_EFFECT))
def test_a_no_effect_field_changes_nothing(client, store, celery, name):
    worker_says(store, celery, "Hello there")
    assert fingerprint(client, store) == fingerprint(client, store, **{name: NO_EFFECT[name]})


@pytest.mark.parametrize("name", sorted(NO_EFFECT))
def test_a_no_effect_field_is_still_type_checked(client, name):
    response = client.post("/v1/chat/completions", json={"messages": USER, name: 12345})
    assert response.status_code == 400 and response.get_json()["error"]["param"] == name


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_a_refused_field_is_a_400_naming_it(client, store, celery, name):
    worker_says(store, celery, "Hello there")
    bad, default = REFUSED[name]
    response = client.post("/v1/chat/completions", json={"messages": USER, name: bad})
    assert response.status_code == 400
    error = response.get_json()["error"]
    assert error["type"] == "invalid_request_error" and error["message"].startswith(f"{error['param']}: ")
    assert error["param"] == name
    assert "not supported" in error["message"]
    accepted = client.post("/v1/chat/completions", json={"messages": USER, name: default})
    assert accepted.status_code == 200, accepted.get_json()


def test_top_logprobs_without_logprobs_is_a_400(client):
    response = client.post("/v1/chat/completions", json={"messages": USER, "top_logprobs": 3})
    error = response.get_json()["error"]
    assert response.status_code == 400 and error["param"] == "top_logprobs" and "logprobs" in error["message"]


@pytest.mark.parametrize("body", [
    {"presence_penalty": 2.5}, {"presence_penalty": False}, {"frequency_penalty": -2.01},
    {"frequency_penalty": "1"}, {"logit_bias": {"42": 101}}, {"logit_bias": {"42": -100.5}},
    {"logit_bias": {"x1": 5}}, {"logit_bias": {"-3": 5}},
    {"logit_bias": {"42": True}}, {"logprobs": True, "top_logprobs": 21}, {"logprobs": 1},
])
def test_out_of_range_sampling_fields_are_a_4xx_naming_them(client, body):
    response = client.post("/v1/chat/completions", json={"messages": USER, **body})
    error = response.get_json()["error"]
    field = "top_logprobs" if "top_logprobs" in body else next(iter(body))
    assert response.status_code in (400, 422), body
    assert error["param"].startswith(field) and error["message"].startswith(field), error


def test_sampling_fields_reach_the_job(client, store, celery):
    worker_says(store, celery, "Hello there")
    body = {"presence_penalty": -2, "frequency_penalty": 2.0, "logit_bias": {"7": -100, "12": 3.5},
            "logprobs": True, "top_logprobs": 20}
    response = client.post("/v1/chat/completions", json={"messages": USER, **body})
    assert response.status_code == 200, response.get_json()
    sampling = store.get(response.headers["X-Job-Id"]).request["sampling"]
    assert sampling["presence_penalty"] == -2 and sampling["frequency_penalty"] == 2.0
    assert sampling["logit_bias"] == [[7, -100.0], [12, 3.5]]
    assert sampling["logprobs"] is True and sampling["top_logprobs"] == 20
    assert response.get_json()["choices"][0]["logprobs"] == {"content": [], "refusal": None}


def test_an_unknown_field_is_a_400_naming_it(client):
    response = client.post("/v1/chat/completions", json={"messages": USER, "typical_p": 0.9})
    error = response.get_json()["error"]
    assert response.status_code == 400 and error["param"] == "typical_p" and "unknown field" in error["message"]


def test_docs_api_table_is_the_code_table():
    from pathlib import Path
    text = (Path(__file__).resolve().parents[2] / "docs" / "api.md").read_text()
    section = text[text.index("### `POST /v1/chat/completions`: every request field"):]
    section = section[:section.index("\n### ", 1)]
    rows = dict(re.findall(r"^\| `([a-z_]+)` \| (honoured|no_effect|refused) \|", section, re.MULTILINE))
    assert rows == {name: rule.kind for name, rule in CHAT_FIELDS.items()}
