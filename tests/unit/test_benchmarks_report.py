"""docs/benchmarks.md and the README's figures block are what ``python -m bench.report`` writes
from the committed results files, so no figure is edited by hand."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench import report


def test_committed_page_and_readme_block_equal_the_report() -> None:
    for path, text in report.outputs(report.ROOT).items():
        assert (report.ROOT / path).read_text() == text, f"{path} is stale: run python -m bench.report"


def test_every_section_reads_its_committed_files() -> None:
    """Every kept benchmark but the new fairness one has results committed, and each listed
    file and linked plot exists (a deleted file would turn a section into 'not run yet')."""
    for section in report.SECTIONS:
        present = [name for name in section.files if (report.ROOT / name).exists()]
        if section.name == "fairness" and not present:
            continue
        assert present == list(section.files), section.name
        assert section.read(report.ROOT).rows, section.name


def _bare_root(tmp_path: Path) -> Path:
    (tmp_path / "docs").mkdir()
    (tmp_path / "results").mkdir()
    (tmp_path / "README.md").write_text(f"# x\n{report.START}\nold\n{report.END}\n")
    return tmp_path


def test_a_benchmark_without_results_says_not_run_yet(tmp_path: Path) -> None:
    root = _bare_root(tmp_path)
    page = report.render_page(root)
    assert page.count("Not run yet") == len(report.SECTIONS)
    assert "`python -m bench.fairness` writes `results/fairness.json`" in page
    assert report.outputs(root)[report.README] == f"# x\n{report.START}\n{report.END}\n"


def test_fairness_results_are_shown_when_present(tmp_path: Path) -> None:
    root = _bare_root(tmp_path)
    (root / "results/fairness.json").write_text(json.dumps({
        "command": "python -m bench.fairness", "machine": {"cpu_model": "Test CPU", "cpus": 4},
        "summary": {"max_gap_over_median": 1.75}}))
    page = report.render_page(root)
    assert "| max_gap_over_median | 1.75 |" in page
    assert "Test CPU, 4 cores" in page
    assert page.count("Not run yet") == len(report.SECTIONS) - 1


def test_figures_follow_the_results_files(tmp_path: Path) -> None:
    """Change a figure in a copied results file: the page and the README block change with it."""
    root = _bare_root(tmp_path)
    source = report.ROOT / "results/quantization.json"
    data = json.loads(source.read_text())
    q8 = next(row for row in data["rows"] if row["setting"] == "q8")
    q8["decode_tps_b1"], q8["speedup_b1"] = 123.4, 9.87
    (root / "results/quantization.json").write_text(json.dumps(data))
    outputs = report.outputs(root)
    assert "| q8 | 123.4 | 9.87x |" in outputs[report.PAGE]
    assert "123.4 tok/s at batch 1, 9.87x bf16" in outputs[report.README]


def test_readme_without_the_marked_block_is_an_error(tmp_path: Path) -> None:
    root = _bare_root(tmp_path)
    (root / "README.md").write_text("# no block\n")
    with pytest.raises(ValueError, match="figures:start"):
        report.outputs(root)


def test_check_mode_reports_a_stale_page(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    root = _bare_root(tmp_path)
    monkeypatch.setattr(report, "ROOT", root)
    assert report.main(["--check"]) == 1
    assert "docs/benchmarks.md differs" in capsys.readouterr().out
    assert report.main([]) == 0 and report.main(["--check"]) == 0
