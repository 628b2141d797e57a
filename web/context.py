"""What every request handler needs, built once by the app factory and kept on the app."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from flask import current_app, g

from core.jobs import JobStore
from core.settings import Settings
from web.prompt_budget import PromptBudget

EXTENSION_KEY = "miniserve"


@dataclass
class WebContext:
    settings: Settings
    store: JobStore
    celery: Any  # a celery.Celery client (or a test double): send_task(...), control.revoke(...)
    budget: PromptBudget
    feeds: Any = None  # web.feeds.FeedHub: one Redis reader per followed job (set by create_app)


def ctx() -> WebContext:
    return current_app.extensions[EXTENSION_KEY]


def request_owner() -> str | None:
    """The caller's owner id (hash of its API key), or ``None`` when auth is off (no filtering)."""
    return g.get("owner")


def note_job(job_id: str) -> None:
    """Attach a job id to this request's log line."""
    g.job_id = job_id
