"""Request models of the Ollama API (``/api``), so ``/openapi.json`` is exact.

The options that are sampling knobs carry the shared fields' types and bounds
(``web.sampling_base``); the OpenAI request each body becomes checks them again with the rest
(``web.ollama.convert``), and its errors name the Ollama field.
Every level forbids unknown fields, and ``options`` names the one it does not take: an
option is honoured or a 400, never dropped.
"""
from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, WithJsonSchema, create_model, model_validator

from web.sampling_base import MAX_STOP_STRINGS, SamplingBase, StopString, json_int

# options -> the OpenAI chat/completion field that honours it
OPTIONS = {"temperature": "temperature", "top_p": "top_p", "top_k": "top_k", "num_predict": "max_tokens",
           "seed": "seed", "stop": "stop", "repeat_penalty": "repetition_penalty",
           "presence_penalty": "presence_penalty", "frequency_penalty": "frequency_penalty", "min_p": "min_p"}


class Forbid(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class _OptionsBase(Forbid):
    """Sampling options and ``num_ctx`` (checked: web/ollama/context.py); any other Ollama option
    (``mirostat``, ``num_gpu``, ...) is a 400 naming it."""

    num_predict: json_int(ge=-1) | None = Field(default=None, description="tokens to generate; -1 = up to "
                                                "MINISERVE_MAX_NEW_TOKENS_CAP; omitted = MINISERVE_DEFAULT_MAX_NEW_TOKENS")
    stop: Annotated[list[StopString], Field(max_length=MAX_STOP_STRINGS)] | None = None
    num_ctx: json_int(ge=1) | None = Field(default=None, description="the prompt plus num_predict must fit in it "
                                           "(else a 400 naming it); the prompt is never cut")

    @model_validator(mode="before")
    @classmethod
    def _known(cls, data: Any) -> Any:
        if isinstance(data, dict):
            for name in data:
                if name not in OPTIONS and name != "num_ctx":
                    raise ValueError(f"options.{name}: not supported (MiniServe takes {', '.join(OPTIONS)}, "
                                     "num_ctx)")
        return data


# The options that are shared sampling knobs take the knob's type, bounds and doc
# (web.sampling_base, declared once in core/sampling_fields.py), under Ollama's name.
Options: type[BaseModel] = create_model(  # type: ignore[call-overload]
    "Options", __base__=_OptionsBase, __module__=__name__,
    **{name: (SamplingBase.model_fields[knob].annotation,
              Field(default=None, description=SamplingBase.model_fields[knob].description))
       for name, knob in OPTIONS.items() if knob in SamplingBase.model_fields and knob != "stop"},
)


class CallFunction(Forbid):
    model_config = ConfigDict(extra="ignore", strict=True)  # Ollama adds "index"
    name: str = Field(min_length=1, max_length=64)
    arguments: dict[str, Any] = Field(default_factory=dict)


class ToolCall(Forbid):
    model_config = ConfigDict(extra="ignore", strict=True)  # newer Ollama adds "id"
    function: CallFunction


class OllamaMessage(Forbid):
    role: Literal["system", "user", "assistant", "tool"]
    content: str = ""
    images: list[str] | None = Field(default=None, description="refused: text only")
    tool_calls: list[ToolCall] | None = Field(default=None, max_length=64)
    tool_name: str | None = Field(default=None, max_length=200, description="a tool result's function")
    thinking: str | None = Field(default=None, description="only empty: the models here do not think apart")


Format = Literal["", "json"] | dict[str, Any]
KeepAlive = str | float | int


class GenerationBase(Forbid):
    model: str = Field(default="", max_length=200, description="an id, alias or name:tag (GET /api/tags)")
    format: Format | None = Field(default=None, description='"json" or a JSON Schema, held by a grammar')
    options: Options | None = None
    stream: bool = Field(default=True, description="NDJSON lines, as Ollama answers; false: one JSON object")
    keep_alive: KeepAlive | None = Field(default=None, description="accepted: workers always keep their model")
    think: bool | None = Field(default=None, description="only false: the models here do not think apart")
    logprobs: bool | None = Field(default=None, description="only false")
    top_logprobs: int | None = Field(default=None, description="only null")


class ChatRequest(GenerationBase):
    """``POST /api/chat``."""

    messages: list[OllamaMessage] = Field(default_factory=list, max_length=256,
                                    description="empty: the model is ready (done_reason load), nothing runs")
    tools: list[dict[str, Any]] | None = Field(default=None, max_length=128,
                                               description="OpenAI-style function tools")


class GenerateRequest(GenerationBase):
    """``POST /api/generate``."""

    prompt: str = Field(default="", description="empty: the model is ready (done_reason load), nothing runs")
    suffix: str | None = Field(default=None, description="fill-in-the-middle (the model's FIM tokens)")
    system: str | None = None
    raw: bool | None = Field(default=None, description="true: the prompt as is, no chat template")
    template: str | None = Field(default=None, description="refused: the model's own chat template is used")
    context: list[int] | None = Field(default=None, description="refused: send the conversation to /api/chat")
    images: list[str] | None = Field(default=None, description="refused: text only")


def _false(value: bool) -> bool:
    if value:
        raise ValueError("only false")
    return value


OnlyFalse = Annotated[bool, AfterValidator(_false), WithJsonSchema({"type": "boolean", "const": False})]


class ShowRequest(Forbid):
    model: str = Field(default="", max_length=200)
    name: str | None = Field(default=None, max_length=200, description="older clients' spelling of model")
    verbose: OnlyFalse | None = Field(default=None, description="only false: every detail known is always shown")


# ---- responses ------------------------------------------------------------------------------
class OllamaError(BaseModel):
    """Ollama's error shape, for every ``/api/`` route: the message names the field."""

    error: str


class OllamaAssistantMessage(BaseModel):
    role: Literal["assistant"]
    content: str
    tool_calls: list[dict[str, Any]] | None = None


class Counts(BaseModel):
    """The last line's figures (durations in nanoseconds)."""

    done_reason: Literal["stop", "length", "load"] | None = None
    total_duration: int | None = None
    load_duration: int | None = None
    prompt_eval_count: int | None = None
    prompt_eval_duration: int | None = None
    eval_count: int | None = None
    eval_duration: int | None = None


NDJSON_CONTENT = {"application/x-ndjson": {"schema": {"type": "string", "description": "one JSON object a line "
                                                      "(this object's shape), the last with done: true"}}}


class ChatResponse(Counts):
    model_config = ConfigDict(openapi_extra={
        "description": "with stream (the default), NDJSON lines of this shape; else one object",
        "content": NDJSON_CONTENT})
    model: str
    created_at: str
    message: OllamaAssistantMessage
    done: bool


class OllamaGenerateResponse(Counts):
    model_config = ConfigDict(openapi_extra={
        "description": "with stream (the default), NDJSON lines of this shape; else one object",
        "content": NDJSON_CONTENT})
    model: str
    created_at: str
    response: str
    done: bool


class ModelDetails(BaseModel):
    parent_model: str
    format: str
    family: str
    families: list[str] | None = None
    parameter_size: str
    quantization_level: str


class ModelEntry(BaseModel):
    name: str
    model: str
    modified_at: str
    digest: str
    details: ModelDetails


class TagsResponse(BaseModel):
    models: list[ModelEntry]


class RunningModel(ModelEntry):
    expires_at: None = None
    context_length: int
    workers: list[str] = Field(description="MiniServe: the live workers holding the model")


class PsResponse(BaseModel):
    models: list[RunningModel]


class ShowResponse(BaseModel):
    modelfile: str
    parameters: str
    template: str
    details: ModelDetails
    model_info: dict[str, Any]
    capabilities: list[str]
    modified_at: str
    aliases: list[str] = Field(description="MiniServe: the other names the model answers to")


class VersionResponse(BaseModel):
    version: str
