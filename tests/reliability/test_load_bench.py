"""``python -m bench.load`` runs end to end from the repository (a small load, not timed):
it must report every job and find none lost, duplicated or failed."""
from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.integration


def test_load_bench_small_run_loses_nothing(tmp_path):
    out = tmp_path / "load.csv"
    done = subprocess.run([sys.executable, "-m", "bench.load", "--clients", "4", "--jobs", "12", "--warmup", "1",
                           "--web-workers", "1", "--output", str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    summary = json.loads(out.with_suffix(".json").read_text())["summary"]
    assert summary["accepted"] == summary["jobs"] == 12
    assert (summary["lost"], summary["duplicated"], summary["failed"], summary["text_mismatches"]) == (0, 0, 0, 0)
    assert summary["jobs_per_s"] > 0 and summary["submit_p50_ms"] > 0
    with out.open() as handle:
        rows = list(csv.DictReader(handle))
    assert len(rows) == 12 and len({r["job_id"] for r in rows}) == 12
    assert out.with_suffix(".png").stat().st_size > 0
    assert "jobs_per_s" in done.stdout and "lost" in done.stdout
