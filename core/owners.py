"""Who owns a job: a hash of the API key that created it, never the key itself.

Shared by the web (which stamps it on each job) and the worker (which finds a key's
webhook secret by it), so both hash a key the same way."""
from __future__ import annotations

import hashlib


def owner_id(api_key: str) -> str:
    return hashlib.sha256(api_key.encode("utf-8")).hexdigest()[:32]


def by_owner(per_key: dict[str, str]) -> dict[str, str]:
    """A setting keyed by API key (``key=value,...``), re-keyed by owner id."""
    return {owner_id(key): value for key, value in per_key.items()}
