"""The playground at ``/``: a chat, a side-by-side compare of the generation methods and an
agent mode, for a learner who wants to *watch* serving happen.

Like the monitor page it is a template plus vanilla JS and CSS in ``web/static/playground``
(no CDN, works offline) and holds no data: everything comes from the public job API
(``POST /jobs``, ``/jobs/{id}/events``, ``/jobs/{id}``, ``/jobs/{id}/cancel``) with the
visitor's key when keys are configured.
"""
from __future__ import annotations

from flask import Blueprint, render_template
from flask_openapi3 import OpenAPI

from core.methods import GENERATION_METHODS
from web.context import ctx
from web.guards import add_public_prefix

page = Blueprint("playground", __name__, static_folder="static/playground",
                 static_url_path="/playground/static", template_folder="templates")
DOC_INDEX_ENDPOINT = "openapi.openapi"  # flask-openapi3's rule for "/"


def playground_page() -> str:
    settings = ctx().settings
    return render_template("playground.html", methods=GENERATION_METHODS,
                           default_method=settings.default_generation_method,
                           auth=bool(settings.api_keys))


def register(app: OpenAPI) -> None:
    """flask-openapi3 (``doc_prefix=""``) already answers ``/`` with an index of its doc UIs;
    the project links ``/docs`` (Swagger UI) instead, so ``/`` is handed to the playground
    rather than adding a second ``/`` rule that would never match."""
    add_public_prefix(app, "/playground/static")
    app.register_blueprint(page)
    if DOC_INDEX_ENDPOINT in app.view_functions:
        app.view_functions[DOC_INDEX_ENDPOINT] = playground_page
    else:
        app.add_url_rule("/", "playground_index", playground_page)
