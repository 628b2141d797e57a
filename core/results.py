"""Writing result files (CSV rows, JSON documents) for benchmarks and evaluations.

Shared by ``bench`` and by the agent evaluation that the workers run as Celery tasks (which
must not import ``bench``)."""
from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any, Iterable


def write_csv(path: str | Path, rows: Iterable[dict[str, Any]]) -> Path:
    rows = list(rows)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fields: list[str] = []
    for row in rows:
        fields += [k for k in row if k not in fields]
    with path.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=fields)
        writer.writeheader()
        writer.writerows(rows)
    return path


def write_json(path: str | Path, payload: Any) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(payload, indent=2, ensure_ascii=False, default=str))
    return path
