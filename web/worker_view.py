"""What a key that is not an admin key may see of a worker's heartbeat."""
from __future__ import annotations

import hashlib
from typing import Any

# Operators' details: where a worker runs and which jobs (of any key) it holds.
PRIVATE_FIELDS = ("host", "pid", "node", "queue", "model", "path", "current_jobs", "load_error")


def public_worker(worker: dict[str, Any]) -> dict[str, Any]:
    """The heartbeat without hosts, pids, paths or job ids: an opaque stable name, the served
    model's id (never its path), a count of running jobs, whether a load failed."""
    info = dict(worker.get("info") or {})
    running = info.get("current_jobs")
    failed = bool(info.get("load_error"))
    for name in PRIVATE_FIELDS:
        info.pop(name, None)
    info["running_jobs"] = len(running) if isinstance(running, list) else 0
    info["load_failed"] = failed
    return {**worker, "name": opaque_name(str(worker.get("name", ""))), "info": info}


def opaque_name(name: str) -> str:
    """A stable stand-in for a worker's name (which carries its host)."""
    return "worker-" + hashlib.sha256(name.encode()).hexdigest()[:12]


def routed_view(routed_to: dict[str, int]) -> dict[str, int]:
    """The router's counts per worker under the same stand-in names."""
    return {opaque_name(name): count for name, count in routed_to.items()}
