"""web.schemas.RequestPart: query and header models build their plain JSON schema once
(flask-openapi3 asks for it on every request), and the OpenAPI document's calls with
arguments still get pydantic's own answer."""
from __future__ import annotations

from pydantic import BaseModel

from web.schemas import EventsQuery, JobListQuery, RequestPart, SubmitHeaders


def test_the_plain_schema_is_pydantics_built_once_per_model():
    for model in (EventsQuery, JobListQuery, SubmitHeaders):
        assert issubclass(model, RequestPart)
        assert model.model_json_schema() is model.model_json_schema()
        assert model.model_json_schema() == BaseModel.model_json_schema.__func__(model)
    assert EventsQuery.model_json_schema() != JobListQuery.model_json_schema()


def test_calls_with_arguments_are_not_cached():
    template = "#/components/schemas/{model}"
    first = SubmitHeaders.model_json_schema(ref_template=template, by_alias=False)
    assert first is not SubmitHeaders.model_json_schema(ref_template=template, by_alias=False)
    assert "idempotency_key" in first["properties"] and "Idempotency-Key" in SubmitHeaders.model_json_schema()["properties"]
