"""Request and response models of the OpenAI-compatible routes, so ``/openapi.json`` is exact.

The top level of a chat request is checked against ``web.openai.fields.CHAT_FIELDS`` first:
every field OpenAI defines is honoured, accepted without effect, or refused with a 400
naming it; an unknown field is a 400. Nested objects (messages, tools) ignore fields they
do not know, so a client can send back the assistant messages it received (``refusal``,
``annotations`` ...).
"""
from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from web.openai.fields import check_chat_fields
from web.sampling_base import GenerationMethod, SamplingBase, json_int  # noqa: F401 - GenerationMethod re-exported
from web.schemas import SSE_EVENT_SCHEMA, GuidedFields

MAX_TOP_LOGPROBS = 20
MAX_CHOICES = 16  # n: choices of one request (each a sequence on the worker)
FUNCTION_NAME_PATTERN = r"^[a-zA-Z0-9_-]{1,64}$"


class Lenient(BaseModel):
    """Unknown fields are ignored (OpenAI clients send many); known ones are type-strict."""

    model_config = ConfigDict(extra="ignore", strict=True)


class TextPart(Lenient):
    type: Literal["text"]
    text: str


class FunctionCallIn(Lenient):
    name: str = Field(min_length=1, max_length=64)
    arguments: str = Field(default="{}", max_length=100_000, description="JSON text, as OpenAI sends it")


class ToolCallIn(Lenient):
    id: str = Field(default="", max_length=200)
    type: Literal["function"] = "function"
    function: FunctionCallIn


class ChatMessage(Lenient):
    """A message of the conversation. ``content`` may be null (an assistant turn that only
    called tools); text parts are joined; ``developer`` is read as ``system``."""

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = Field(default=None)
    name: str | None = Field(default=None, max_length=200)
    tool_calls: list[ToolCallIn] | None = Field(default=None, max_length=64)
    tool_call_id: str | None = Field(default=None, max_length=200)


class FunctionDef(Lenient):
    name: str = Field(pattern=FUNCTION_NAME_PATTERN)
    description: str | None = Field(default=None, max_length=10_000)
    parameters: dict[str, Any] | None = Field(default=None, description="a JSON Schema of the arguments "
                                              "(checked; an invalid schema is a 400)")
    strict: bool | None = None


class ToolDef(Lenient):
    type: Literal["function"]
    function: FunctionDef


class NamedFunction(Lenient):
    name: str = Field(pattern=FUNCTION_NAME_PATTERN)


class NamedToolChoice(Lenient):
    type: Literal["function"]
    function: NamedFunction


class StreamOptions(Lenient):
    include_usage: bool = False


class ChatCompletionRequest(Lenient, GuidedFields, SamplingBase):  # type: ignore[misc, valid-type]
    """``POST /v1/chat/completions``. ``temperature`` omitted = 0 (greedy), as everywhere in
    MiniServe. ``response_format`` (json_object, json_schema) and tool calls are enforced by a
    grammar while decoding. The sampling fields are the shared base's (``web.sampling_base``);
    MiniServe extensions among them and ``guided_choice``, ``guided_regex`` are sent with the
    openai client's ``extra_body``."""

    model: str = Field(default="", max_length=200, description="an id from /v1/models (unknown: 404 "
                       "model_not_found); empty = the cluster's default model")
    messages: list[ChatMessage] = Field(min_length=1, max_length=256)
    max_tokens: json_int(ge=1) | None = Field(default=None, description="capped by MINISERVE_MAX_NEW_TOKENS_CAP")
    max_completion_tokens: json_int(ge=1) | None = Field(
        default=None, description="same as max_tokens (wins when both are given)")
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    tools: list[ToolDef] | None = Field(default=None, max_length=128)
    tool_choice: Literal["auto", "none", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool | None = Field(default=None, description="false: at most one call is returned")
    n: json_int(ge=1, le=MAX_CHOICES) | None = Field(
        default=None, description=f"1..{MAX_CHOICES} choices, in one job; choice i is seeded seed + i")
    logprobs: bool | None = Field(default=None, description="per-token log-probabilities after penalties and "
                                  "logit_bias, before the grammar mask and temperature/top-k/top-p")
    top_logprobs: json_int(ge=0, le=MAX_TOP_LOGPROBS) | None = Field(
        default=None, description=f"0..{MAX_TOP_LOGPROBS} most likely alternatives per token; needs logprobs")

    @model_validator(mode="before")
    @classmethod
    def _known_fields(cls, data: Any) -> Any:
        """Unknown and refused fields are a 400 naming them (``web.openai.fields``)."""
        check_chat_fields(data)
        return data


# ---- responses ------------------------------------------------------------------------------
class OpenAIErrorBody(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class OpenAIError(BaseModel):
    """OpenAI's error shape, used by every ``/v1`` route."""

    error: OpenAIErrorBody


class FunctionCallOut(BaseModel):
    name: str
    arguments: str


class ToolCallOut(BaseModel):
    id: str
    type: Literal["function"]
    function: FunctionCallOut


class AssistantMessage(BaseModel):
    role: Literal["assistant"]
    content: str | None = None
    tool_calls: list[ToolCallOut] | None = None


class TopLogprob(BaseModel):
    token: str
    logprob: float
    bytes: list[int] | None = None


class TokenLogprob(TopLogprob):
    top_logprobs: list[TopLogprob]


class ChoiceLogprobs(BaseModel):
    content: list[TokenLogprob] | None = None
    refusal: list[TokenLogprob] | None = None


class Choice(BaseModel):
    index: int
    message: AssistantMessage
    finish_reason: Literal["stop", "length", "tool_calls"]
    logprobs: ChoiceLogprobs | None = None


class PromptTokensDetails(BaseModel):
    cached_tokens: int


class CompletionTokensDetails(BaseModel):
    """Speculative decoding's drafts (present when the job drafted)."""

    accepted_prediction_tokens: int
    rejected_prediction_tokens: int


class CompletionUsage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails
    completion_tokens_details: CompletionTokensDetails | None = None


class ChatCompletion(BaseModel):
    model_config = ConfigDict(openapi_extra={
        "description": "the completion; with stream=true, Server-Sent Events of `chat.completion.chunk` "
                       "objects ending with `data: [DONE]`",
        "content": {"text/event-stream": {"schema": {**SSE_EVENT_SCHEMA, "required": ["data"]}}},
    })
    id: str
    object: Literal["chat.completion"]
    created: int
    model: str
    choices: list[Choice]
    usage: CompletionUsage
    system_fingerprint: str | None = None
    miniserve: dict[str, Any] = Field(description="job_id, generation_method and timings of the job")


class ModelCard(BaseModel):
    id: str
    object: Literal["model"]
    created: int
    owned_by: str


class ModelPath(BaseModel):
    model: str = Field(max_length=200, description="a model id, as GET /v1/models lists it")


class ModelList(BaseModel):
    object: Literal["list"]
    data: list[ModelCard]
