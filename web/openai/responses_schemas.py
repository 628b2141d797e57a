"""Request and answer models of ``/v1/responses`` (OpenAI's Responses API, stateless plus
``previous_response_id`` over stored jobs), so ``/openapi.json`` is exact.

The top level is checked against :data:`web.openai.responses_fields.RESPONSE_FIELDS` first.
Input items are told apart by ``type`` (a message may leave it out, as OpenAI allows); an
item type other than ``message``, ``function_call`` and ``function_call_output`` is a 400
naming ``input.N``. Nested objects ignore fields they do not know, so the output items a
client received (``id``, ``status``, ``annotations`` ...) can be sent back as they are.
"""
from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Discriminator, Field, Tag, model_validator

from web.openai.responses_fields import check_response_fields
from web.openai.schemas import FUNCTION_NAME_PATTERN, Lenient
from web.sampling_base import SamplingBase, json_int
from web.schemas import SSE_EVENT_SCHEMA

ITEM_TYPES = ("message", "function_call", "function_call_output")


class ContentPart(Lenient):
    type: Literal["input_text", "output_text"]
    text: str = Field(max_length=1_000_000)


class MessageItem(Lenient):
    type: Literal["message"] = "message"
    role: Literal["system", "developer", "user", "assistant"]
    content: str | list[ContentPart] = Field(max_length=1_000_000)


class FunctionCallItem(Lenient):
    type: Literal["function_call"]
    call_id: str = Field(min_length=1, max_length=200)
    name: str = Field(min_length=1, max_length=64)
    arguments: str = Field(default="{}", max_length=100_000, description="JSON text, as OpenAI sends it")


class FunctionCallOutputItem(Lenient):
    type: Literal["function_call_output"]
    call_id: str = Field(min_length=1, max_length=200)
    output: str | list[ContentPart] = Field(max_length=1_000_000)


def _known_item(value: Any) -> Any:
    """A 400 naming the item for a type this server does not take (images, reasoning, ...)."""
    if isinstance(value, dict) and value.get("type", "message") not in ITEM_TYPES:
        raise ValueError(f"item type {value.get('type')!r} is not supported (only {', '.join(ITEM_TYPES)})")
    return value


def _item_tag(value: Any) -> str | None:
    """An item's ``type``; a message may leave it out."""
    return value.get("type", "message") if isinstance(value, dict) else getattr(value, "type", None)


InputItem = Annotated[Annotated[MessageItem, Tag("message")] | Annotated[FunctionCallItem, Tag("function_call")]
                      | Annotated[FunctionCallOutputItem, Tag("function_call_output")],
                      Discriminator(_item_tag), BeforeValidator(_known_item)]


class FunctionTool(Lenient):
    type: Literal["function"]
    name: str = Field(pattern=FUNCTION_NAME_PATTERN)
    description: str | None = Field(default=None, max_length=10_000)
    parameters: dict[str, Any] | None = Field(default=None, description="a JSON Schema of the arguments "
                                              "(checked; an invalid schema is a 400)")
    strict: bool | None = None


class FunctionChoice(Lenient):
    type: Literal["function"]
    name: str = Field(pattern=FUNCTION_NAME_PATTERN)


class PlainFormat(Lenient):
    type: Literal["text"]


class JsonObjectFormat(Lenient):
    type: Literal["json_object"]


class JsonSchemaFormat(Lenient):
    model_config = ConfigDict(extra="ignore", strict=True, populate_by_name=True)

    type: Literal["json_schema"]
    name: str = Field(pattern=r"^[a-zA-Z0-9_-]{1,64}$")
    description: str | None = Field(default=None, max_length=10_000)
    json_schema: dict[str, Any] = Field(alias="schema")
    strict: bool | None = None


def _no_verbosity(value: Any) -> Any:
    if value is not None:
        raise ValueError("not supported (no verbosity control); only null")
    return value


class TextConfig(Lenient):
    format: Annotated[PlainFormat | JsonObjectFormat | JsonSchemaFormat, Field(discriminator="type")] | None = None
    verbosity: Annotated[None, BeforeValidator(_no_verbosity)] = Field(default=None, description="only null")


class ResponseRequest(Lenient, SamplingBase):  # type: ignore[misc, valid-type]
    """``POST /v1/responses``. ``temperature`` omitted = 0 (greedy), as everywhere in MiniServe.
    The sampling fields are the shared base's (``web.sampling_base``); those OpenAI's
    Responses API lacks are MiniServe extensions (``extra_body`` with the openai client)."""

    input: Annotated[list[InputItem], Field(min_length=1, max_length=256)] | Annotated[
        str, Field(max_length=1_000_000)] = Field(description="a user message, or input items")
    instructions: str | None = Field(default=None, max_length=1_000_000)
    model: str = Field(default="", max_length=200)
    max_output_tokens: json_int(ge=1) | None = Field(default=None, description="capped by "
                                                     "MINISERVE_MAX_NEW_TOKENS_CAP")
    stream: bool | None = False
    tools: list[FunctionTool] | None = Field(default=None, max_length=128)
    tool_choice: Literal["auto", "none", "required"] | FunctionChoice | None = None
    parallel_tool_calls: bool | None = None
    text: TextConfig | None = None
    store: bool | None = Field(default=None, description="null/true: kept as its job; false: not retrievable")
    previous_response_id: str | None = Field(default=None, min_length=1, max_length=200)
    background: bool | None = Field(default=None, description="true: answered at once; poll GET /v1/responses/{id}")
    stream_options: dict[str, Any] | None = None

    @model_validator(mode="before")
    @classmethod
    def _known_fields(cls, data: Any) -> Any:
        check_response_fields(data)
        return data


class ResponseIdPath(BaseModel):
    response_id: str = Field(max_length=200, description="resp_<job id>, as POST /v1/responses answered")


class ResponseObject(BaseModel):
    """OpenAI's Response object (the fields MiniServe fills; see docs/api.md)."""

    model_config = ConfigDict(extra="allow", openapi_extra={
        "description": "the response; with stream=true, Server-Sent Events (`event:` the type, `data:` the "
                       "event with its sequence_number) from response.created to response.completed",
        "content": {"text/event-stream": {"schema": {**SSE_EVENT_SCHEMA, "required": ["event", "data"]}}},
    })
    id: str
    object: Literal["response"]
    created_at: float
    status: Literal["completed", "incomplete", "failed", "cancelled", "queued", "in_progress"]
    model: str
    output: list[dict[str, Any]]
    usage: dict[str, Any] | None = None
    miniserve: dict[str, Any] = Field(description="job_id, generation_method and timings of the job")
