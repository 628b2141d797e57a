"""bench.spec_ceiling's replay of the serving loop: the arithmetic behind its upper bound, on made-up
step costs (the measured ones come from the benchmark run), and a smoke run on the tiny model."""
from __future__ import annotations

import json

import pytest

from bench import spec_ceiling as ceiling


def _costs(fixed: float, per_row: float) -> dict[tuple[int, int], float]:
    """Steps costing ``fixed + per_row * rows`` for every shape the benchmark measures."""
    return {(b, r): fixed + per_row * b * r for b, r in ceiling.SHAPES}


def test_rows_beyond_the_measured_shapes_follow_the_last_slope():
    costs = _costs(0.01, 0.002)
    assert ceiling.cost_of(costs, 8) == pytest.approx(0.026)
    assert ceiling.cost_of(costs, 20) == pytest.approx(0.05)      # between 8x2 and 8x3
    assert ceiling.cost_of(costs, 100) == pytest.approx(0.21)     # past 8x9


def test_nothing_to_copy_gains_nothing_and_free_rows_gain_the_most():
    nothing = [("none", 40)] * 12
    assert ceiling.replay(nothing, _costs(0.01, 0.002), 4) == ceiling.replay(nothing, _costs(0.01, 0.002), 0)
    jobs = [("copy", 41), ("none", 41)] * 6
    rows_only, weights_only = _costs(0.0, 0.002), _costs(0.01, 0.0)
    # every row paid for: accepted drafts save nothing (the loop still computes every token once)
    assert ceiling.replay(jobs, rows_only, 4) == pytest.approx(ceiling.replay(jobs, rows_only, 0), rel=0.02)
    # only the step's fixed part paid for: fewer steps, a real gain
    assert ceiling.replay(jobs, weights_only, 0) / ceiling.replay(jobs, weights_only, 4) > 1.3


def test_the_jobs_come_from_the_first_spec_off_serving_round(tmp_path):
    header = ("quant,mode,prompt,kind,lang,speculative,completion_tokens,draft_tokens,accepted_draft_tokens,"
              "decode_tok_s,wall_s,ttft_s\n")
    rows = ["q8,serving,a,copy,en,False,10,0,0,1,5.0,1", "q8,serving,b,none,en,False,12,0,0,1,5.0,1",
            "q8,serving,a,copy,en,True,10,9,8,1,4.0,1", "q8,serving,a,copy,en,False,11,0,0,1,6.0,1",
            "none,serving,a,copy,en,False,13,0,0,1,5.0,1", "q8,batch1,a,copy,en,False,128,0,0,1,5.0,1"]
    path = tmp_path / "speculative.csv"
    path.write_text(header + "\n".join(rows) + "\n")
    path.with_suffix(".json").write_text(json.dumps({"summary": {"q8": {"batch8_x": 0.94}}}))
    assert ceiling.serving_jobs(path, "q8") == [("copy", 10), ("none", 12)]
    assert ceiling.measured_loop_x(path, "q8") == 0.94 and ceiling.measured_loop_x(path, "none") is None


def test_a_smoke_run_on_the_tiny_model_writes_its_report(tiny_model_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("MINISERVE_MODEL", str(tiny_model_dir))
    monkeypatch.setenv("MINISERVE_DTYPE", "float32")
    monkeypatch.setattr(ceiling, "read_bandwidth_gbs", lambda: 1.0)
    jobs = tmp_path / "speculative.csv"
    jobs.write_text("quant,mode,prompt,kind,lang,speculative,completion_tokens,draft_tokens,accepted_draft_tokens,"
                    "decode_tok_s,wall_s,ttft_s\n" + "".join(f"none,serving,p,{('copy', 'none')[i % 2]},en,False,"
                                                           f"{20 + i},0,0,1,3.0,1\n" for i in range(10)))
    assert ceiling.main(["--quant", "none", "--jobs-from", str(jobs), "--context", "24", "--rounds", "1",
                         "--out", str(tmp_path)]) == 0
    report = json.loads((tmp_path / "spec_ceiling_none.json").read_text())
    assert report["jobs"] == 10 and set(report["ceiling_x_by_drafts"]) == {str(k) for k in range(1, 9)}
    assert all(x > 0 for x in report["ceiling_x_by_drafts"].values()) and (tmp_path / "spec_ceiling_none.png").exists()
