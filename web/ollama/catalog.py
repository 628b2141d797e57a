"""``/api/tags``, ``/api/show``, ``/api/ps`` and ``/api/version``: the cluster's models as
Ollama lists them, from the workers' heartbeats (``core.models``, ``core.workers``).

A model's Ollama name is its first alias that carries a tag (``qwen2.5-coder:0.5b``), else
its id with ``:latest``; every name a request may use resolves as on ``/v1``
(``core.models.Served.resolve``). ``/api/ps`` lists each model live workers hold, with the
workers (a MiniServe field): a worker loads its model once and keeps it, so there is no
expiry (``expires_at`` null) and ``keep_alive`` changes nothing.
"""
from __future__ import annotations

import hashlib
from typing import Any

from flask import jsonify
from flask_openapi3 import APIBlueprint, Tag

from core.models import Served
from core.workers import list_workers
from web.context import ctx
from web.guards import is_admin
from web.models import STARTED_AT, cluster_models, pick_model
from web.ollama.routes import ERRORS
from web.ollama.schemas import PsResponse, ShowRequest, ShowResponse, TagsResponse, VersionResponse
from web.ollama.shape import created_at
from web.openai.completion_convert import has_fim_tokens
from web.worker_view import opaque_name

api = APIBlueprint("ollama_catalog", __name__, url_prefix="/api",
                   abp_tags=[Tag(name="ollama", description="Ollama-compatible API")])
# The Ollama release whose API this one follows (clients check it before using newer fields).
OLLAMA_API_VERSION = "0.12.0"


def ollama_name(model: str, names: list[str]) -> str:
    return next((name for name in names if ":" in name), f"{model}:latest")


def _heartbeats() -> dict[str, dict[str, Any]]:
    """One live worker's self-description per model (architecture, quantization, path)."""
    out: dict[str, dict[str, Any]] = {}
    for worker in list_workers(ctx().store.client, ctx().settings.worker_max_age_s):
        info = worker.get("info") or {}
        if isinstance(info.get("model_id"), str):
            out.setdefault(info["model_id"], info)
    return out


def _details(info: dict[str, Any]) -> dict[str, Any]:
    family = str(info.get("architecture") or "").split(" ")[0]
    path = str(info.get("model") or "")
    return {"parent_model": "", "format": "gguf" if path.lower().endswith(".gguf") else "safetensors",
            "family": family, "families": [family] if family else None, "parameter_size": "",
            "quantization_level": str(info.get("quant") or info.get("dtype") or "")}


def _entry(model: str, models: Served, info: dict[str, Any]) -> dict[str, Any]:
    name = ollama_name(model, models.names(model))
    return {"name": name, "model": name, "modified_at": created_at(STARTED_AT),
            "digest": hashlib.sha256(model.encode()).hexdigest(), "details": _details(info)}


@api.get("/tags", summary="Every model a request may name (Ollama API)", responses={200: TagsResponse, **ERRORS})
def tags():
    models, beats = cluster_models(), _heartbeats()
    return jsonify({"models": [_entry(m, models, beats.get(m, {})) for m in models.available()]})


def _names(workers: Any) -> list[str]:
    """Workers' names carry their hosts: only an admin key sees them (as on /workers)."""
    return sorted(workers) if is_admin() else sorted(opaque_name(w) for w in workers)


@api.get("/ps", summary="The models live workers hold, with their workers (Ollama API)",
         responses={200: PsResponse, **ERRORS})
def ps():
    models, beats = cluster_models(), _heartbeats()
    return jsonify({"models": [{**_entry(m, models, beats.get(m, {})), "expires_at": None,
                                "context_length": ctx().budget.context_length(m), "workers": _names(workers)}
                               for m, workers in sorted(models.live.items())]})


@api.post("/show", summary="One model's details and capabilities (Ollama API)",
          responses={200: ShowResponse, **ERRORS})
def show(body: ShowRequest):
    model, models = pick_model(body.model or body.name or None)
    info = _heartbeats().get(model, {})
    details = _details(info)
    family = details["family"] or "unknown"
    text = ctx().budget.model(model)
    capabilities = ["completion", "tools"] + (["insert"] if text and has_fim_tokens(text.tokenizer) else [])
    model_info = {"general.architecture": family, "general.basename": model,
                  f"{family}.context_length": ctx().budget.context_length(model)}
    return jsonify({"modelfile": "", "parameters": "", "template": "", "details": details,
                    "model_info": model_info, "capabilities": capabilities,
                    "modified_at": created_at(STARTED_AT), "aliases": models.names(model)})


@api.get("/version", summary="The Ollama API version this one follows (Ollama API)",
         responses={200: VersionResponse, **ERRORS})
def version():
    return jsonify({"version": OLLAMA_API_VERSION})
