"""Pydantic models for every request body and response, so ``/openapi.json`` is exact.

Bodies forbid unknown fields (a typo like ``max_tokens`` is a 422, not silently ignored).
Range limits that depend on settings (``max_new_tokens`` cap, prompt length) are checked
in :mod:`web.submit`, after the schema, because the schema is fixed at import time.
"""
from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from core.events import ALL_STATES
from core.jobs import JOB_TYPES
from web.sampling_base import (  # noqa: F401 - the shared field types, re-exported for the surfaces
    MAX_LOGIT_BIAS, MAX_STOP_STRINGS, GenerationMethod, PriorityField, SamplingBase, StopString, json_int,
)

JobState = Literal[ALL_STATES]  # type: ignore[valid-type]
JobType = Literal[JOB_TYPES]  # type: ignore[valid-type]
SubmitType = Literal["generate", "agent"]
Role = Literal["system", "user", "assistant", "tool"]
MAX_AGENT_STEPS = 20


# One Server-Sent Event as OpenAPI 3.1 describes a text/event-stream item: `data` is the
# event's JSON ({"seq", "type", "attempt", "ts", "data"}); `id` is its seq; `event` its type.
SSE_EVENT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"id": {"type": "string", "pattern": "^[0-9]+$"}, "event": {"type": "string"},
                   "data": {"type": "string", "contentMediaType": "application/json"}},
    "required": ["id", "event", "data"],
}


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)  # no silent coercion: "1" is not 1


# ---- request bodies -------------------------------------------------------------------------
class Message(Strict):
    role: Role
    content: str = Field(max_length=1_000_000)


class TextFormat(Strict):
    type: Literal["text"]


class JsonObjectFormat(Strict):
    type: Literal["json_object"]


class JsonSchemaSpec(Strict):
    model_config = ConfigDict(extra="forbid", strict=True, populate_by_name=True)

    name: str = Field(pattern=r"^[a-zA-Z0-9_-]{1,64}$")
    description: str | None = Field(default=None, max_length=10_000)
    json_schema: dict[str, Any] = Field(alias="schema", description="the JSON Schema the answer must validate "
                                        "against (checked; unsupported features are a 4xx that lists them)")
    strict: bool | None = Field(default=None, description="accepted; answers always follow the schema")


class JsonSchemaFormat(Strict):
    type: Literal["json_schema"]
    json_schema: JsonSchemaSpec


ResponseFormat = Annotated[TextFormat | JsonObjectFormat | JsonSchemaFormat, Field(discriminator="type")]
GUIDED_DESCRIPTIONS = {
    "response_format": "structured output: json_object (any JSON object) or json_schema (valid against "
                       "the schema); enforced by a grammar while decoding",
    "guided_choice": "extension: the answer is exactly one of these strings",
    "guided_regex": "extension: the answer matches this regular expression",
}


class GuidedFields(BaseModel):
    """Constrained decoding (at most one of the three); see docs/constrained.md."""

    response_format: ResponseFormat | None = Field(default=None, description=GUIDED_DESCRIPTIONS["response_format"])
    guided_choice: Annotated[list[Annotated[str, Field(min_length=1, max_length=1024)]],
                             Field(min_length=1, max_length=256)] | None = Field(
        default=None, description=GUIDED_DESCRIPTIONS["guided_choice"])
    guided_regex: str | None = Field(default=None, min_length=1, max_length=4096,
                                     description=GUIDED_DESCRIPTIONS["guided_regex"])

    def format_dict(self) -> dict[str, Any] | None:
        return self.response_format.model_dump(by_alias=True) if self.response_format is not None else None


ModelName = Annotated[str, Field(min_length=1, max_length=200)]
MODEL_DESCRIPTION = ("the model that answers (an id from /v1/models); null = the cluster's default: "
                     "MINISERVE_MODEL of the web, or the only model served")


class ModelField(BaseModel):
    """Several models per cluster (web/models.py): which one a job is for."""

    model: ModelName | None = Field(default=None, description=MODEL_DESCRIPTION)


class SamplingFields(Strict, GuidedFields, ModelField, SamplingBase):  # type: ignore[misc, valid-type]
    """The generation bodies' fields: the shared sampling base (``web.sampling_base``) plus
    the token cap and token ids, as ``/jobs`` and ``/generate`` spell them."""

    max_new_tokens: json_int(ge=1) | None = Field(
        default=None, description="capped by MINISERVE_MAX_NEW_TOKENS_CAP")
    return_token_ids: bool = Field(default=False, description="keep the generated token ids in the result")


class JobOptions(BaseModel):
    """When a job must be done by, and whom to tell when it is (docs/scheduling.md); checked
    against the clock and the webhook rules in :func:`web.submit.job_options`."""

    deadline: Annotated[float, Field(gt=0)] | None = Field(
        default=None, description="unix seconds (as created_at): still queued then, the job ends `expired` "
        "unrun; still running, it ends `timeout` with its partial result. Not with timeout_s")
    timeout_s: Annotated[float, Field(gt=0)] | None = Field(
        default=None, description="the deadline as seconds from now")
    webhook_url: str | None = Field(
        default=None, min_length=1, max_length=2048, description="http(s) URL POSTed the job's record (as "
        "GET /jobs/{id} shows it) once it ends, signed per Standard Webhooks; private and loopback "
        "addresses are refused (MINISERVE_WEBHOOK_ALLOW_HOSTS)")


class JobSubmit(SamplingFields, JobOptions):
    """``POST /jobs``: exactly one of ``prompt`` and ``messages``."""

    type: SubmitType = "generate"
    prompt: str | None = Field(default=None, min_length=1)
    messages: list[Message] | None = Field(default=None, min_length=1, max_length=256)
    prefix: str | None = Field(default=None, description="system prefix that prefix_cache keys on")
    system: str | None = Field(default=None, description="system message (not with prefix)")
    max_steps: json_int(ge=1, le=MAX_AGENT_STEPS) | None = Field(
        default=None, description="agent jobs only")

    @model_validator(mode="after")
    def _one_input(self) -> "JobSubmit":
        if (self.prompt is None) == (self.messages is None):
            raise ValueError("prompt: give exactly one of prompt and messages")
        if self.prefix is not None and self.system is not None:
            raise ValueError("system: give prefix or system, not both")
        if self.type == "agent" and self.prompt is None:
            raise ValueError("prompt: agent jobs take a prompt")
        if self.type != "agent" and self.max_steps is not None:
            raise ValueError("max_steps: only for agent jobs")
        return self


class GenerateBody(SamplingFields):
    """``POST /generate``, as in the original MiniServe (plus the extra sampling knobs)."""

    prompt: str = Field(min_length=1)
    prefix: str | None = None
    stream: bool = False


class AgentBody(Strict, ModelField, JobOptions, PriorityField):
    """``POST /agent/run``, as in the original MiniServe."""

    prompt: str = Field(min_length=1)
    max_steps: json_int(ge=1, le=MAX_AGENT_STEPS) = 3
    max_new_tokens: json_int(ge=1) | None = None


# ---- path, query and header parameters ------------------------------------------------------
class JobPath(BaseModel):
    job_id: str = Field(min_length=1, description="32 lowercase hex digits; any other text is a 404, "
                        "as an unknown id is")


_PART_SCHEMAS: dict[type, dict[str, Any]] = {}


class RequestPart(BaseModel):
    """A query or header model whose plain JSON schema is built once: flask-openapi3 asks
    for it on every request that has one (to find list fields), and pydantic builds it
    anew each time, about 0.3 ms of CPU per ``GET /jobs/{id}/events`` or ``POST /jobs``
    (py-spy: 8% of a web process opening a thousand streams). Calls with arguments (the
    OpenAPI document's) are not cached."""

    @classmethod
    def model_json_schema(cls, *args: Any, **kwargs: Any) -> dict[str, Any]:  # type: ignore[override]
        if args or kwargs:
            return super().model_json_schema(*args, **kwargs)
        if cls not in _PART_SCHEMAS:
            _PART_SCHEMAS[cls] = super().model_json_schema()
        return _PART_SCHEMAS[cls]


class JobListQuery(RequestPart):
    model_config = ConfigDict(extra="forbid")  # an unknown query parameter is a 422, as the document says

    state: JobState | None = None
    type: JobType | None = None
    limit: int = Field(default=50, ge=1, le=500)


class EventsQuery(RequestPart):
    after: int | None = Field(default=None, ge=0, description="replay events with seq > after "
                              "(the Last-Event-ID header does the same); above 2^63-1: 400 bad_last_event_id")


class SubmitHeaders(RequestPart):
    model_config = ConfigDict(extra="allow")
    idempotency_key: str | None = Field(default=None, alias="Idempotency-Key", max_length=200,
                                        description="a retried submission with the same key returns the same job")


# ---- responses --------------------------------------------------------------------------------
class ErrorDetail(BaseModel):
    field: str
    message: str


class ErrorBody(BaseModel):
    code: str
    message: str
    field: str | None = None
    details: list[ErrorDetail] | None = None
    job_id: str | None = None


class ErrorResponse(BaseModel):
    error: ErrorBody
    trace: list[dict[str, Any]] | None = None


class JobLinks(BaseModel):
    self: str
    events: str
    cancel: str


class JobAccepted(BaseModel):
    id: str
    state: JobState
    links: JobLinks


class JobView(BaseModel):
    id: str
    type: JobType
    state: JobState
    queue: str
    created_at: float
    started_at: float | None = None
    finished_at: float | None = None
    attempt: int
    max_attempts: int
    last_seq: int
    worker: str
    request: dict[str, Any]
    result: dict[str, Any] | None = None
    error: dict[str, Any] | None = None
    deadline: float | None = Field(default=None, description="unix seconds; see JobOptions")
    webhook_url: str | None = None
    queue_position: int | None = Field(default=None, description="queued jobs only (GET /jobs/{id}): jobs "
                                       "ahead of it in its queue, 0 = next; null until its message is sent")
    estimated_start: float | None = Field(default=None, description="queued jobs only: unix seconds, from the "
                                          "queue's measured start rate; null until it has one")
    usage: dict[str, Any] | None = None
    timings: dict[str, Any]
    links: JobLinks


class JobList(BaseModel):
    jobs: list[JobView]


class GenerateResponse(BaseModel):
    model_config = ConfigDict(openapi_extra={
        "description": "the finished generation; with stream=true, Server-Sent Events of the job",
        "content": {"text/event-stream": {"schema": SSE_EVENT_SCHEMA}},
    })
    text: str
    generation_method: str
    usage: dict[str, Any]
    timings: dict[str, Any]
    finish_reason: str
    job_id: str


class AgentResponse(BaseModel):
    text: str
    steps: int
    trace: list[dict[str, Any]]
    job_id: str


class HealthResponse(BaseModel):
    status: Literal["ok", "no_workers", "redis_unavailable"]
    redis: bool
    workers: int


class WorkerView(BaseModel):
    name: str
    last_seen: float
    age_s: float
    info: dict[str, Any]


class WorkerList(BaseModel):
    workers: list[WorkerView]


class QueueDepths(BaseModel):
    queues: dict[str, int]
    max_queue_depth: int = Field(description="0 = unbounded")
