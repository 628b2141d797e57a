"""Typical structured-output and tool-argument schemas, each with a valid example answer.

Shared by :mod:`bench.grammar_engines` (the example's tokens are the path each engine walks)
and :mod:`bench.constrained_overhead`. ``schema=None`` stands for ``json_object`` (any JSON
object).
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class GrammarCase:
    name: str
    schema: dict[str, Any] | None
    example: Any

    def example_text(self) -> str:
        return json.dumps(self.example, separators=(",", ":"), ensure_ascii=False)


WEATHER = {"type": "object", "properties": {
    "location": {"type": "string", "description": "city and country"},
    "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
    "required": ["location", "unit"], "additionalProperties": False}
CALCULATOR = {"type": "object", "properties": {"expression": {"type": "string"}},
              "required": ["expression"], "additionalProperties": False}
SEARCH = {"type": "object", "properties": {
    "query": {"type": "string"}, "max_results": {"type": "integer", "minimum": 1, "maximum": 50},
    "safe": {"type": "boolean"}}, "required": ["query", "max_results"], "additionalProperties": False}
ORDER = {"type": "object", "properties": {
    "customer": {"type": "object", "properties": {
        "name": {"type": "string"}, "email": {"type": "string"},
        "address": {"type": "object", "properties": {"street": {"type": "string"}, "city": {"type": "string"},
                                                     "zip": {"type": "string", "pattern": "^[0-9]{5}$"}},
                    "required": ["street", "city", "zip"], "additionalProperties": False}},
        "required": ["name", "address"], "additionalProperties": False},
    "items": {"type": "array", "minItems": 1, "items": {"type": "object", "properties": {
        "sku": {"type": "string"}, "quantity": {"type": "integer", "minimum": 1},
        "price": {"type": "number"}}, "required": ["sku", "quantity"], "additionalProperties": False}},
    "priority": {"type": "string", "enum": ["low", "normal", "high"]}},
    "required": ["customer", "items", "priority"], "additionalProperties": False}

CASES = [
    GrammarCase("json_object", None, {"answer": "Paris", "confidence": 0.9, "tags": ["capital", "france"]}),
    GrammarCase("weather", WEATHER, {"location": "Paris, France", "unit": "celsius"}),
    GrammarCase("calculator", CALCULATOR, {"expression": "12 * (3 + 4)"}),
    GrammarCase("search", SEARCH, {"query": "paged attention kv cache", "max_results": 5, "safe": True}),
    GrammarCase("order", ORDER, {"customer": {"name": "Ada", "email": "ada@example.com",
                                              "address": {"street": "1 Main St", "city": "Paris", "zip": "75001"}},
                                 "items": [{"sku": "A-1", "quantity": 2, "price": 9.5}], "priority": "high"}),
]
