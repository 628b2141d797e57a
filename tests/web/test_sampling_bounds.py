"""Every surface gives each shared sampling field the same type and bounds, those the core
declares (core/sampling_fields.py), and refuses a value just outside them with a 4xx
naming the field.

The models are introspected (their JSON schema per field), so a surface that declares a
shared field again, or drops one, fails here."""
from __future__ import annotations

from typing import Any

import pytest

from core.sampling_fields import KNOBS
from tests.web.conftest import run_job
from web.anthropic.schemas import MessagesRequest
from web.openai.completion_schemas import CompletionRequest
from web.openai.responses_schemas import ResponseRequest
from web.openai.schemas import ChatCompletionRequest
from web.sampling_base import SHARED_FIELDS, SamplingBase
from web.schemas import GenerateBody, JobSubmit

# route -> (its request model, the smallest valid body)
SURFACES: dict[str, tuple[Any, dict[str, Any]]] = {
    "/jobs": (JobSubmit, {"prompt": "Hi"}),
    "/generate": (GenerateBody, {"prompt": "Hi"}),
    "/v1/chat/completions": (ChatCompletionRequest, {"messages": [{"role": "user", "content": "Hi"}]}),
    "/v1/completions": (CompletionRequest, {"prompt": "Hi"}),
    "/v1/responses": (ResponseRequest, {"input": "Hi"}),
    "/v1/messages": (MessagesRequest, {"model": "", "max_tokens": 8, "messages": [{"role": "user", "content": "Hi"}]}),
}
JSON_BOUNDS = {"ge": "minimum", "gt": "exclusiveMinimum", "le": "maximum"}


def _field_schema(model: Any, name: str) -> dict[str, Any]:
    return model.model_json_schema()["properties"][name]


@pytest.mark.parametrize("route", sorted(SURFACES))
def test_every_shared_field_has_the_bases_schema_on_every_surface(route):
    model = SURFACES[route][0]
    assert issubclass(model, SamplingBase)
    for name in SHARED_FIELDS:
        assert _field_schema(model, name) == _field_schema(SamplingBase, name), (route, name)


@pytest.mark.parametrize("spec", KNOBS, ids=lambda spec: spec.name)
def test_each_knob_has_the_cores_bounds(spec):
    branch = next(b for b in _field_schema(SamplingBase, spec.name)["anyOf"] if b.get("type") != "null")
    assert {JSON_BOUNDS[k]: v for k, v in spec.bounds().items()} == {
        v: branch[v] for v in JSON_BOUNDS.values() if v in branch}
    assert branch["type"] == {int: "integer", float: "number", bool: "boolean"}[spec.kind]


def _outside(spec: Any) -> list[Any]:
    """Values just outside each bound of ``spec`` (a bool: a value of another type)."""
    out: list[Any] = ["yes"] if spec.kind is bool else []
    if spec.ge is not None:
        out.append(spec.ge - 1 if spec.kind is int else spec.ge - 0.001)
    if spec.gt is not None:
        out.append(spec.gt)
    if spec.le is not None:
        out.append(spec.le + 1 if spec.kind is int else spec.le + 0.001)
    return out


CASES = [(route, spec.name, value) for route in sorted(SURFACES) for spec in KNOBS for value in _outside(spec)]


@pytest.mark.parametrize("route,name,value", CASES)
def test_a_value_outside_the_bounds_is_a_4xx_naming_the_field(client, route, name, value):
    response = client.post(route, json={**SURFACES[route][1], name: value})
    assert response.status_code in (400, 422), (route, name, value)
    error = response.get_json()["error"]
    if error.get("type") != "invalid_request_error" or "param" in error:  # Anthropic's errors name it in the message only
        assert (error.get("field") or error.get("param")) == name, error
    assert error["message"].startswith(name + ":"), error


@pytest.mark.parametrize("route", sorted(SURFACES))
def test_the_knobs_reach_the_stored_job_on_every_surface(client, store, celery, route):
    celery.runner = lambda job_id: run_job(store, job_id)
    knobs = {"min_p": 0.1, "min_tokens": 3, "ignore_eos": True, "top_k": 4, "repetition_penalty": 1.5}
    response = client.post(route, json={**SURFACES[route][1], **knobs})
    assert response.status_code in (200, 202), response.get_json()
    sampling = store.get(celery.sent[-1]["task_id"]).request["sampling"]
    assert {name: sampling[name] for name in knobs} == knobs
