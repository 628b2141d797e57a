"""Request and answer models of ``/v1/messages`` and ``/v1/messages/count_tokens``
(Anthropic's Messages API), so ``/openapi.json`` is exact.

The top level is checked against :data:`web.anthropic.fields.MESSAGE_FIELDS` first. Nested
objects are strict: a content block of another type (image, document, thinking ...), a tool
of another type (server tools) or a key a block does not have is a 400 naming it. Texts have
no length limit of their own: the body's size limit (``MINISERVE_MAX_BODY_BYTES``) and the
model's context hold them.
``cache_control`` is accepted wherever Anthropic allows it, and changes nothing (the prefix
cache is automatic).
"""
from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Discriminator, Field, Tag, model_validator
from pydantic_core import PydanticCustomError

from web.anthropic.fields import check_count_fields, check_message_fields
from web.openai.schemas import FUNCTION_NAME_PATTERN
from web.sampling_base import MAX_STOP_STRINGS, SamplingBase, StopString, json_int
from web.schemas import SSE_EVENT_SCHEMA, Strict

BLOCK_TYPES = ("text", "tool_use", "tool_result")


def _str_or_list(value: Any) -> str:
    return "str" if isinstance(value, str) else "list"


def text_or(blocks: Any) -> Any:
    """A string or a list of ``blocks``: an error names what is wrong in the one that was sent
    (a list's bad block, not "should be a valid string")."""
    return Annotated[Annotated[str, Tag("str")] | Annotated[list[blocks], Field(max_length=1024), Tag("list")],
                     Discriminator(_str_or_list)]


class CacheControl(Strict):
    type: Literal["ephemeral"]
    ttl: Literal["5m", "1h"] | None = None


class TextBlock(Strict):
    type: Literal["text"]
    text: str
    cache_control: CacheControl | None = Field(default=None, description="accepted; no effect")
    citations: None = Field(default=None, description="only null")


class ToolUseBlock(Strict):
    """A call the assistant made (sent back as the assistant turn)."""

    type: Literal["tool_use"]
    id: str = Field(min_length=1, max_length=200)
    name: str = Field(min_length=1, max_length=128)
    input: dict[str, Any]
    cache_control: CacheControl | None = None


class ToolResultBlock(Strict):
    """A tool's answer, in the user turn after the call; ``is_error`` marks the text as an error."""

    type: Literal["tool_result"]
    tool_use_id: str = Field(min_length=1, max_length=200)
    content: text_or(TextBlock) = ""
    is_error: bool | None = None
    cache_control: CacheControl | None = None


def _known_block(value: Any) -> Any:
    """A 400 naming the block for a type this server does not take (image, document, thinking ...)."""
    if isinstance(value, dict) and value.get("type") not in BLOCK_TYPES:
        raise PydanticCustomError("unsupported_block", "content block type {kind} is not supported (only {known})",
                                  {"kind": repr(value.get("type")), "known": ", ".join(BLOCK_TYPES)})
    return value


def _block_tag(value: Any) -> str | None:
    kind = value.get("type") if isinstance(value, dict) else getattr(value, "type", None)
    return f"[{kind}]"


# Tags in brackets: an error's location names the field, not the tag (web.errors drops them).
ContentBlock = Annotated[Annotated[TextBlock, Tag("[text]")] | Annotated[ToolUseBlock, Tag("[tool_use]")]
                         | Annotated[ToolResultBlock, Tag("[tool_result]")],
                         Discriminator(_block_tag), BeforeValidator(_known_block)]


class MessageParam(Strict):
    """A turn: ``content`` a string or blocks (tool_use only from the assistant, tool_result only
    from the user)."""

    role: Literal["user", "assistant"]
    content: text_or(ContentBlock)

    @model_validator(mode="after")
    def _blocks_fit_the_role(self) -> "MessageParam":
        wrong = "tool_result" if self.role == "assistant" else "tool_use"
        if isinstance(self.content, list) and any(block.type == wrong for block in self.content):
            raise PydanticCustomError("misplaced_block", "content: a {wrong} block is not allowed in the "
                                      "{role}'s turn", {"wrong": wrong, "role": self.role})
        return self


class ToolParam(Strict):
    """A custom tool; Anthropic's server tools (another ``type``) are refused."""

    type: Literal["custom"] | None = None
    name: str = Field(pattern=FUNCTION_NAME_PATTERN)
    description: str | None = Field(default=None, max_length=10_000)
    input_schema: dict[str, Any] = Field(description="a JSON Schema of the input (checked; an invalid "
                                         "schema is a 400)")
    cache_control: CacheControl | None = None
    strict: bool | None = Field(default=None, description="accepted: calls are always held to the schema")


class ToolChoiceAuto(Strict):
    type: Literal["auto"]
    disable_parallel_tool_use: bool | None = None


class ToolChoiceAny(Strict):
    type: Literal["any"]
    disable_parallel_tool_use: bool | None = None


class ToolChoiceTool(Strict):
    type: Literal["tool"]
    name: str = Field(pattern=FUNCTION_NAME_PATTERN)
    disable_parallel_tool_use: bool | None = None


class ToolChoiceNone(Strict):
    type: Literal["none"]


ToolChoice = Annotated[ToolChoiceAuto | ToolChoiceAny | ToolChoiceTool | ToolChoiceNone, Field(discriminator="type")]


class Metadata(Strict):
    user_id: str | None = Field(default=None, max_length=512)


class PromptFields(Strict):
    """What ``/v1/messages`` and ``/v1/messages/count_tokens`` share: the prompt."""

    model: str = Field(max_length=200, description="an id, alias or name:tag (GET /v1/models); a cluster of one "
                       "model answers any name with it; of several, an unknown name is a 404")
    messages: list[MessageParam] = Field(min_length=1, max_length=256)
    system: text_or(TextBlock) | None = None
    tools: list[ToolParam] | None = Field(default=None, max_length=128)
    tool_choice: ToolChoice | None = None
    cache_control: CacheControl | None = Field(default=None, description="accepted; no effect")

    @model_validator(mode="after")
    def _ends_with_the_user(self) -> "PromptFields":
        """A last assistant turn asks Anthropic to continue it (prefill); the chat template
        here would open a new turn after it instead, so it is refused rather than answered
        differently."""
        if self.messages[-1].role == "assistant":
            raise ValueError("messages: the last turn is the assistant's (a prefill to continue): not supported; "
                             "end with a user turn")
        return self


class MessagesRequest(PromptFields, SamplingBase):  # type: ignore[misc, valid-type]
    """``POST /v1/messages``. ``temperature`` omitted = 0 (greedy), as everywhere in MiniServe.
    The sampling fields every surface shares come from ``SamplingBase`` (Anthropic's own:
    ``temperature``, ``top_p``, ``top_k``; the rest MiniServe extensions)."""

    max_tokens: json_int(ge=1) = Field(description="required; capped by MINISERVE_MAX_NEW_TOKENS_CAP")
    stop_sequences: list[StopString] | None = Field(default=None, max_length=MAX_STOP_STRINGS)
    stream: bool | None = False
    metadata: Metadata | None = Field(default=None, description="accepted; not stored")

    @model_validator(mode="before")
    @classmethod
    def _known_fields(cls, data: Any) -> Any:
        """Unknown and refused fields are a 400 naming them (``web.anthropic.fields``)."""
        check_message_fields(data)
        return data


class CountTokensRequest(PromptFields):
    """``POST /v1/messages/count_tokens``: the prompt's tokens, as ``/v1/messages`` would send it."""

    @model_validator(mode="before")
    @classmethod
    def _known_fields(cls, data: Any) -> Any:
        check_count_fields(data)
        return data


# ---- answers ---------------------------------------------------------------------------------
class AnthropicErrorDetail(BaseModel):
    type: str
    message: str


class AnthropicError(BaseModel):
    """Anthropic's error shape, used by both routes."""

    type: Literal["error"]
    error: AnthropicErrorDetail


class MessageUsage(BaseModel):
    input_tokens: int = Field(description="prompt tokens not read from the prefix cache")
    output_tokens: int
    cache_read_input_tokens: int = Field(description="prompt tokens read from the prefix cache")
    cache_creation_input_tokens: int


class MessageObject(BaseModel):
    model_config = ConfigDict(extra="allow", openapi_extra={
        "description": "the message; with stream=true, Server-Sent Events (`event:` the type, `data:` the "
                       "event) from message_start to message_stop",
        "content": {"text/event-stream": {"schema": {**SSE_EVENT_SCHEMA, "required": ["event", "data"]}}},
    })
    id: str
    type: Literal["message"]
    role: Literal["assistant"]
    model: str
    content: list[dict[str, Any]] = Field(description="text and tool_use blocks")
    stop_reason: Literal["end_turn", "max_tokens", "stop_sequence", "tool_use"] | None
    stop_sequence: str | None
    usage: MessageUsage


class TokenCount(BaseModel):
    input_tokens: int
