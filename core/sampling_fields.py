"""The sampling knobs every request surface shares, declared once (torch-free).

:class:`SamplingKnobs` is the one declaration: each field's name, type, default, bounds and
doc. Both sides are derived from it, so they cannot drift:

- the engine's :class:`engine.types.SamplingParams` subclasses it (adding what only the
  engine sees: the token cap, stop strings, bias pairs, log-probabilities);
- the web's pydantic base (:class:`web.sampling_base.SamplingBase`) builds one optional
  field per knob with these bounds, and every surface (``/jobs``, ``/generate``, chat,
  completions, responses) inherits it; the stored job request carries the knobs under
  their own names (``web.sampling_base.stored_knobs``), which the worker hands to
  ``SamplingParams`` as they are.

Fields that differ per surface stay with the surface: the token cap's name
(``max_new_tokens``, ``max_tokens``, ``max_completion_tokens``, ``max_output_tokens``),
``stop``, ``logit_bias`` and the log-probability fields (OpenAI spells them differently on
each endpoint). docs/architecture.md has the recipe for adding a knob.
"""
from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass, field
from typing import Any

# Temperatures below this are stored as 0 (greedy) by the web: dividing float32 scores by
# them overflows, and they mean greedy anyway (the engine clamps too: engine/sampling.py).
GREEDY_BELOW = 0.01


@dataclass(frozen=True)
class KnobSpec:
    """One knob as the web builds it: ``kind`` is int, float or bool; ``nullable`` when its
    default is ``None`` (a null then means something, e.g. the model's own default)."""

    name: str
    kind: type
    default: Any
    doc: str
    ge: float | None = None
    gt: float | None = None
    le: float | None = None

    @property
    def nullable(self) -> bool:
        return self.default is None

    def bounds(self) -> dict[str, float]:
        return {k: v for k, v in (("ge", self.ge), ("gt", self.gt), ("le", self.le)) if v is not None}


def knob(default: Any, doc: str, *, ge: float | None = None, gt: float | None = None,
         le: float | None = None) -> Any:
    """A :class:`SamplingKnobs` field: its default, and its doc and bounds as metadata."""
    return field(default=default, metadata={"doc": doc, "ge": ge, "gt": gt, "le": le})


@dataclass(frozen=True)
class SamplingKnobs:
    """How to pick tokens, as every surface spells it. ``temperature == 0`` is greedy."""

    temperature: float = knob(0.0, f"0 = greedy (the default; below {GREEDY_BELOW} also greedy)",
                              ge=0.0, le=2.0)
    top_p: float = knob(1.0, "nucleus sampling: keep the most likely tokens up to this probability; 1 = off",
                        gt=0.0, le=1.0)
    top_k: int = knob(0, "keep the k most likely tokens; 0 = off", ge=0, le=1000)
    repetition_penalty: float | None = knob(None, "over prompt and generated tokens, as transformers; "
                                            "null = the model's default", ge=GREEDY_BELOW, le=10.0)
    presence_penalty: float = knob(0.0, "OpenAI's: subtracted once from every token already generated",
                                   ge=-2.0, le=2.0)
    frequency_penalty: float = knob(0.0, "OpenAI's: times how often the token was generated, subtracted",
                                    ge=-2.0, le=2.0)
    seed: int | None = knob(None, "seeds the sampler (choice i of a request: seed + i)", ge=0, le=2**63 - 1)
    min_p: float = knob(0.0, "drop tokens whose probability is below min_p times the most likely token's "
                        "(after temperature); 0 = off", ge=0.0, le=1.0)
    min_tokens: int = knob(0, "end-of-sequence and stop strings cannot end the answer before this many tokens "
                           "(the token cap still does)", ge=0, le=2**31 - 1)
    ignore_eos: bool = knob(False, "end-of-sequence is never chosen: the answer runs to the token cap or a "
                            "stop string")


def _kind(annotation: Any) -> type:
    """``float | None`` -> float (the one non-None member)."""
    members = [a for a in typing.get_args(annotation) if a is not type(None)] or [annotation]
    return members[0]


def knob_specs() -> tuple[KnobSpec, ...]:
    """Every knob of :class:`SamplingKnobs`, in declaration order."""
    hints = typing.get_type_hints(SamplingKnobs)
    return tuple(KnobSpec(f.name, _kind(hints[f.name]), f.default, f.metadata["doc"], f.metadata["ge"],
                          f.metadata["gt"], f.metadata["le"]) for f in dataclasses.fields(SamplingKnobs))


KNOBS: tuple[KnobSpec, ...] = knob_specs()
KNOB_NAMES: tuple[str, ...] = tuple(k.name for k in KNOBS)
