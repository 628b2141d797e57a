"""The sampling knobs are declared once (core/sampling_fields.py): the engine's request type
derives from the declaration, and what the web stores for a body is what the worker reads."""
from __future__ import annotations

import dataclasses

from core.sampling_fields import KNOBS, SamplingKnobs
from engine.types import SamplingParams
from web.sampling_base import SamplingBase, stored_knobs
from worker.requests import sampling_from


def test_the_engines_sampling_params_derive_from_the_core_declaration():
    assert issubclass(SamplingParams, SamplingKnobs)
    defaults = {f.name: f.default for f in dataclasses.fields(SamplingParams)}
    assert {spec.name: spec.default for spec in KNOBS} == {spec.name: defaults[spec.name] for spec in KNOBS}


def test_every_knob_the_web_stores_reaches_the_engine_unchanged():
    values = {"temperature": 0.7, "top_p": 0.9, "top_k": 5, "repetition_penalty": 1.2, "presence_penalty": 0.5,
              "frequency_penalty": -0.5, "seed": 3, "min_p": 0.05, "min_tokens": 2, "ignore_eos": True}
    assert set(values) == {spec.name for spec in KNOBS}  # a new knob gets a value here
    stored = {"max_new_tokens": 9, **stored_knobs(SamplingBase(**values)), "stop": []}
    params = sampling_from({"sampling": stored}, default_max_new_tokens=1)
    assert {spec.name: getattr(params, spec.name) for spec in KNOBS} == values


def test_a_plain_body_stores_the_classic_knobs_only():
    assert stored_knobs(SamplingBase()) == {"temperature": 0.0, "top_p": 1.0, "top_k": 0,
                                            "repetition_penalty": None, "seed": None}

