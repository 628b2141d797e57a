"""What the benchmarks that start a local stack share (``bench.load``, its connections mode,
``bench.scale``, ``bench.soak``): the tiny model they serve when none is named, and whether
the web answers yet."""
from __future__ import annotations

from pathlib import Path

import requests


def tiny_model(folder: Path) -> str:
    from tests.tiny_model import make_tiny_model_dir

    return str(make_tiny_model_dir(folder, hidden_size=64, num_layers=2))


def web_is_up(base_url: str) -> bool:
    try:
        return requests.get(f"{base_url}/healthz", timeout=2).status_code == 200
    except requests.RequestException:
        return False
