"""The one pydantic base of the sampling fields every surface shares.

``/jobs``, ``/generate``, ``/v1/chat/completions``, ``/v1/completions`` and ``/v1/responses``
each inherit :class:`SamplingBase`, so a shared field has the same type, bounds and doc on
all of them (``tests/web/test_sampling_bounds.py`` checks it by introspection). Its knobs are
built from :class:`core.sampling_fields.SamplingKnobs`, the one declaration the engine's
``SamplingParams`` also derives from: a knob added there appears here, with its bounds, on
every surface. Every field is optional: ``None`` is the knob's default (the OpenAI surfaces
must take the nulls clients send). The surface's own config applies (strict ``/jobs``
bodies forbid unknown fields; ``/v1`` bodies check them against their field tables).

What stays per surface: the token cap's name (``max_new_tokens``, ``max_tokens``,
``max_completion_tokens``, ``max_output_tokens``), mapped in that surface's one conversion
function, and the log-probability fields, which OpenAI shapes differently per endpoint.
"""
from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, Field, create_model, field_validator

from core.methods import BATCHED_METHOD, GENERATION_METHODS
from core.priorities import PRIORITY_CLASSES
from core.sampling_fields import GREEDY_BELOW, KNOBS, KnobSpec

GenerationMethod = Literal[GENERATION_METHODS]  # type: ignore[valid-type]
MAX_STOP_STRINGS = 8
MAX_LOGIT_BIAS = 1024  # logit_bias entries (OpenAI's own limit is lower)
StopString = Annotated[str, Field(min_length=1)]
# Stored in every job request, set or not (the stored shape older workers read); any other
# knob is stored only when it differs from its default.
ALWAYS_STORED = ("temperature", "top_p", "top_k", "repetition_penalty", "seed")


def _integral_float_to_int(value: Any) -> Any:
    """JSON Schema counts 2.0 as an integer; strict pydantic would not."""
    return int(value) if isinstance(value, float) and value.is_integer() else value


def json_int(**constraints: Any) -> Any:
    """An int (constraints first, so they reach the JSON Schema) that also takes 2.0."""
    return Annotated[int, Field(**constraints), BeforeValidator(_integral_float_to_int)]


def _annotation(spec: KnobSpec) -> Any:
    if spec.kind is int:
        return json_int(**spec.bounds()) | None
    return Annotated[spec.kind, Field(**spec.bounds())] | None


# The fields besides the knobs, with the notes the /v1 field tables print.
OTHER_NOTES = {
    "stop": f"a stop string or up to {MAX_STOP_STRINGS} of them",
    "logit_bias": "token id (as a string) -> -100..100 added to its logit; -100 bans it",
    "generation_method": f"{' | '.join(GENERATION_METHODS)}; null = the service default, "
                         f"MINISERVE_DEFAULT_GENERATION_METHOD ({BATCHED_METHOD})",
    "speculative": "true/false: force prompt-lookup speculative decoding on/off for this request; "
                   "null = MINISERVE_SPECULATIVE",
    "cache_salt": "prefix-cache scope within your key (vLLM's field): only requests with the same salt "
                  "share cached prompt blocks",
    "priority": f"{' | '.join(PRIORITY_CLASSES)}: which waiting work goes first (docs/scheduling.md); "
                "null = the surface's default (/v1 and /api: interactive; /jobs, /generate, /agent/run: "
                "default; Batch API lines: batch); a key may be capped (MINISERVE_KEY_PRIORITY_CAPS)",
}
# Every shared field and its note (the knobs' docs first).
SAMPLING_NOTES: dict[str, str] = {**{spec.name: spec.doc for spec in KNOBS}, **OTHER_NOTES}


def _greedy_below(cls: type, value: float | None) -> float | None:
    """Temperatures this small would overflow the scaled scores; they mean greedy anyway,
    and the schema (0..2) cannot express a gap, so they are stored as 0."""
    return 0.0 if value is not None and value < GREEDY_BELOW else value


class PriorityField(BaseModel):
    """The job's priority class: on every sampling surface (through :class:`SamplingBase`)
    and on ``/agent/run``."""

    priority: Literal[PRIORITY_CLASSES] | None = Field(  # type: ignore[valid-type]
        default=None, description=OTHER_NOTES["priority"])


class _Others(PriorityField):
    """The shared fields that are not knobs of the sampler itself."""

    stop: StopString | Annotated[list[StopString], Field(max_length=MAX_STOP_STRINGS)] | None = Field(
        default=None, description=OTHER_NOTES["stop"])
    logit_bias: dict[str, Annotated[float, Field(ge=-100.0, le=100.0)]] | None = Field(
        default=None, max_length=MAX_LOGIT_BIAS, description=OTHER_NOTES["logit_bias"])
    generation_method: GenerationMethod | None = Field(default=None, description=OTHER_NOTES["generation_method"])
    speculative: bool | None = Field(default=None, description=OTHER_NOTES["speculative"])
    cache_salt: str | None = Field(default=None, min_length=1, max_length=256, description=OTHER_NOTES["cache_salt"])


SamplingBase: type[BaseModel] = create_model(  # type: ignore[call-overload]
    "SamplingBase", __base__=_Others, __module__=__name__,
    __validators__={"_temperature": field_validator("temperature")(classmethod(_greedy_below))},
    **{spec.name: (_annotation(spec), Field(default=None, description=spec.doc)) for spec in KNOBS},
)
SamplingBase.__doc__ = "The sampling fields every surface shares (see the module doc); None = the default."
SHARED_FIELDS: tuple[str, ...] = tuple(SAMPLING_NOTES)


def stored_knobs(body: Any) -> dict[str, Any]:
    """The body's knobs as the stored job request carries them (nulls as their defaults; see
    :data:`ALWAYS_STORED`). The worker passes them to ``SamplingParams`` by name."""
    out: dict[str, Any] = {}
    for spec in KNOBS:
        value = getattr(body, spec.name)
        value = spec.default if value is None else value
        if spec.name in ALWAYS_STORED or value != spec.default:
            out[spec.name] = value
    return out


def stop_list(body: Any) -> list[str]:
    return [body.stop] if isinstance(body.stop, str) else list(body.stop or [])
