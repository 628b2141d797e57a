"""Finishing touches on the generated OpenAPI document so it describes the API exactly.

flask-openapi3 builds the document from the pydantic models; a few facts only exist at
run time or across fields, and are written in here:
- limits from settings (``max_new_tokens`` maximum = ``MINISERVE_MAX_NEW_TOKENS_CAP``);
- the rules between fields of ``POST /jobs`` (exactly one of prompt / messages, prefix or
  system, agent jobs take a prompt, max_steps only for agent jobs), as JSON Schema;
- no ``securitySchemes: null`` (invalid OpenAPI) when no API keys are configured.
"""
from __future__ import annotations

from typing import Any

from flask_openapi3 import OpenAPI

from core.settings import Settings

# Body schemas and their token-count fields whose maximum is MINISERVE_MAX_NEW_TOKENS_CAP.
CAPPED_FIELDS = {"JobSubmit": ("max_new_tokens",), "GenerateBody": ("max_new_tokens",),
                 "AgentBody": ("max_new_tokens",),
                 "ChatCompletionRequest": ("max_tokens", "max_completion_tokens"),
                 "CompletionRequest": ("max_tokens",)}
_GIVEN = {"prompt": {"type": "string"}, "messages": {"type": "array"}, "prefix": {"type": "string"},
          "system": {"type": "string"}}  # "given" = present and not null
JOB_SUBMIT_RULES: dict[str, Any] = {
    "oneOf": [{"required": ["prompt"], "properties": {"prompt": _GIVEN["prompt"]}},
              {"required": ["messages"], "properties": {"messages": _GIVEN["messages"]}}],
    "not": {"required": ["prefix", "system"],
            "properties": {"prefix": _GIVEN["prefix"], "system": _GIVEN["system"]}},
    "if": {"required": ["type"], "properties": {"type": {"const": "agent"}}},
    "then": {"required": ["prompt"], "properties": {"prompt": _GIVEN["prompt"]}},
    "else": {"properties": {"max_steps": {"type": "null"}}},
}


class MiniServeOpenAPI(OpenAPI):
    """``OpenAPI`` whose document is post-processed once, the first time it is served."""

    def __init__(self, *args: Any, settings: Settings, **kwargs: Any) -> None:
        self.miniserve_settings = settings
        super().__init__(*args, **kwargs)

    @property
    def api_doc(self) -> dict:
        if not self.spec_json:
            self.generate_spec_json()
            finish_document(self.spec_json, self.miniserve_settings)
        return self.spec_json


def finish_document(spec: dict[str, Any], settings: Settings) -> None:
    components = spec.setdefault("components", {})
    if not components.get("securitySchemes"):
        components.pop("securitySchemes", None)
    schemas = components.get("schemas", {})
    for name, fields in CAPPED_FIELDS.items():
        for field_name in fields:
            prop = schemas.get(name, {}).get("properties", {}).get(field_name)
            if prop is not None:
                _set_maximum(prop, settings.max_new_tokens_cap)
    if "JobSubmit" in schemas:
        schemas["JobSubmit"].update(JOB_SUBMIT_RULES)


def _set_maximum(prop: dict[str, Any], maximum: int) -> None:
    for variant in prop.get("anyOf", [prop]):
        if variant.get("type") == "integer":
            variant["maximum"] = maximum
