"""The soak's memory mode: its /proc readings add up, every job it sends is a valid ``POST /jobs``
body, and the report shows the readings and the official job's reload."""
from __future__ import annotations

import os

import pytest

from bench import report_service as report
from bench.soak_memory import KINDS, job_body, read_memory
from web.schemas import JobSubmit


def test_a_reading_splits_resident_memory_into_anon_and_file():
    held = bytearray(64 * 2**20)  # 64 MB of private heap, touched
    held[::4096] = b"x" * len(held[::4096])
    got = read_memory(os.getpid())
    assert got["RssAnon_mb"] >= 64
    assert got["VmRSS_mb"] == pytest.approx(got["RssAnon_mb"] + got["RssFile_mb"] + got["RssShmem_mb"], abs=1)
    assert got["VmHWM_mb"] >= got["VmRSS_mb"] and got["Pss_mb"] <= got["VmRSS_mb"] + 1
    assert got["file_mappings_mb"] and all("/" not in name for name in got["file_mappings_mb"])
    del held


@pytest.mark.parametrize("kind", KINDS)
def test_every_mixed_job_is_a_valid_submission(kind):
    body = JobSubmit.model_validate(job_body(kind, 3, 16))
    assert body.max_new_tokens >= 4


def test_the_report_shows_the_readings_and_the_reload(tmp_path):
    reading = {"VmRSS_mb": 1200.0, "RssAnon_mb": 1000.0, "RssFile_mb": 200.0, "Pss_mb": 1100.0, "VmHWM_mb": 1500.0,
               "file_mappings_mb": {"libtorch_cpu.so": 104.0}}
    data = {"command": "python -m bench.soak --memory", "model": "m", "quant": "q8", "pool": "threads",
            "concurrency": 8, "clients": 8, "max_tokens": 16, "jobs": 100, "cpu": "AMD EPYC",
            "readings": [{"stage": s, **reading} for s in ("started", "after 100 mixed jobs", "after an official job")],
            "official_reload": [{"event": "full_weights_restored", "mb": 990.0, "latency_ms": 1500},
                                {"event": "full_weights_freed", "mb": 990.0}]}
    title, header, rows = report.soak_memory(data)
    assert len(rows) == 3 and rows[1][:2] == ["after 100 mixed jobs", "1200"] and "libtorch_cpu.so 104" in rows[0][-1]
    (note,) = report.official_reload_note(data["official_reload"])
    assert "990 MB" in note and "1500 ms" in note and "freed" in note
