"""Request and response models of ``POST /v1/completions`` (OpenAI's legacy text completion).

The top level is checked against ``web.openai.completion_fields.COMPLETION_FIELDS`` first.
"""
from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from web.openai.completion_fields import check_completion_fields
from web.openai.schemas import MAX_CHOICES, MAX_TOP_LOGPROBS, CompletionUsage, Lenient, StreamOptions
from web.sampling_base import SamplingBase, json_int
from web.schemas import SSE_EVENT_SCHEMA

MAX_PROMPTS = 64          # prompts in one request
MAX_TOTAL_CHOICES = 64    # prompts x n
DEFAULT_MAX_TOKENS = 16   # OpenAI's default for this endpoint


def _no_token_ids(data: Any) -> None:
    prompt = data.get("prompt") if isinstance(data, dict) else None
    if isinstance(prompt, list) and any(not isinstance(p, str) for p in prompt):
        raise ValueError("prompt: token id prompts are not supported; send the text (a string or a list of strings)")


class CompletionRequest(Lenient, SamplingBase):  # type: ignore[misc, valid-type]
    """``POST /v1/completions``: the prompt as is (no chat template). ``temperature``
    omitted = 0 (greedy), as everywhere in MiniServe; ``max_tokens`` omitted = 16, as OpenAI.
    The sampling fields are the shared base's (``web.sampling_base``)."""

    model: str = Field(default="", max_length=200, description="an id from /v1/models; empty = the default model")
    prompt: str | Annotated[list[str], Field(min_length=1, max_length=MAX_PROMPTS)] = Field(
        description=f"a string, or up to {MAX_PROMPTS} of them (one choice per prompt, n each)")
    suffix: str | None = Field(default=None, description="fill-in-the-middle: the text after the insertion")
    echo: bool | None = Field(default=None, description="the answer starts with the prompt")
    logprobs: json_int(ge=0, le=MAX_TOP_LOGPROBS) | None = Field(
        default=None, description=f"0..{MAX_TOP_LOGPROBS}: per-token log-probabilities and that many alternatives")
    max_tokens: json_int(ge=1) | None = Field(default=None, description="omitted = 16; capped by "
                                              "MINISERVE_MAX_NEW_TOKENS_CAP")
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    n: json_int(ge=1, le=MAX_CHOICES) | None = Field(default=None, description=f"1..{MAX_CHOICES} choices per prompt")
    best_of: json_int(ge=1) | None = Field(default=None, description="only null, 1 or n")
    user: str | None = None

    @model_validator(mode="before")
    @classmethod
    def _known_fields(cls, data: Any) -> Any:
        _no_token_ids(data)
        check_completion_fields(data)
        return data

    @property
    def prompts(self) -> list[str]:
        return [self.prompt] if isinstance(self.prompt, str) else list(self.prompt)


class LegacyLogprobs(BaseModel):
    tokens: list[str]
    token_logprobs: list[float | None]
    top_logprobs: list[dict[str, float] | None]
    text_offset: list[int]


class CompletionChoice(BaseModel):
    index: int
    text: str
    logprobs: LegacyLogprobs | None = None
    finish_reason: Literal["stop", "length"] | None


class Completion(BaseModel):
    model_config = ConfigDict(openapi_extra={
        "description": "the completion; with stream=true, Server-Sent Events of `text_completion` objects "
                       "ending with `data: [DONE]`",
        "content": {"text/event-stream": {"schema": {**SSE_EVENT_SCHEMA, "required": ["data"]}}},
    })
    id: str
    object: Literal["text_completion"]
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: CompletionUsage | None = None
    system_fingerprint: str | None = None
    miniserve: dict[str, Any] | None = Field(default=None, description="job_id, generation_method and timings")
