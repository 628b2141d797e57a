"""bench/ holds only the benchmarks ``python -m bench`` lists: the registry stays short, each
entry runs, and no runnable module sits in bench/ without an entry."""
from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest

import bench.__main__ as cli
import bench.registry as registry
from bench.registry import BENCHMARKS, Benchmark, find

BENCH_DIR = Path(registry.__file__).parent
ELSEWHERE = {"bench.fairness", "bench.report"}   # written on other branches: listed, imported lazily
RUNNABLE = re.compile(r"^if __name__ == [\"']__main__[\"']", re.M)


def test_at_most_16_benchmarks_with_distinct_names_and_one_line_questions():
    names = [b.name for b in BENCHMARKS]
    assert len(BENCHMARKS) <= 16 and len(set(names)) == len(names)
    assert all(b.question.strip() and "\n" not in b.question for b in BENCHMARKS)


@pytest.mark.parametrize("bench", BENCHMARKS, ids=lambda b: b.name)
def test_every_registered_module_imports_and_has_a_main(bench):
    if bench.module in ELSEWHERE and not bench.available():
        pytest.skip(f"{bench.module} is written on another branch")
    assert callable(importlib.import_module(bench.module).main)
    for child in bench.children:
        assert RUNNABLE.search(_source(child)), f"{child} is started as a child process but cannot run"


def test_every_runnable_module_in_bench_is_registered():
    known = {b.module for b in BENCHMARKS} | {c for b in BENCHMARKS for c in b.children} | {"bench.__main__"}
    runnable = {f"bench.{p.stem}" for p in BENCH_DIR.glob("*.py") if RUNNABLE.search(p.read_text())}
    assert runnable - known == set(), "register these in bench/registry.py, or move them out of bench/"


def test_the_report_asks_each_benchmark_the_question_the_listing_gives():
    if not find("report").available():
        pytest.skip("bench.report is written on another branch")
    from bench.report import SECTIONS

    assert {s.name: s.question for s in SECTIONS} == {s.name: find(s.name).question for s in SECTIONS}


def test_the_listing_names_every_benchmark_and_a_missing_one_says_so(monkeypatch, capsys):
    ghost = Benchmark("ghost", "bench.no_such_module", "What if the module is not here?")
    monkeypatch.setattr(registry, "BENCHMARKS", (*BENCHMARKS, ghost))
    monkeypatch.setattr(cli, "BENCHMARKS", (*BENCHMARKS, ghost))
    assert cli.main([]) == 0
    out = capsys.readouterr().out
    assert all(b.name in out and b.question in out for b in BENCHMARKS)
    assert "ghost" in out and "[not on this checkout]" in out.split("ghost", 1)[1].splitlines()[0]
    assert cli.main(["ghost"]) == 2 and "bench.no_such_module" in capsys.readouterr().err
    assert cli.main(["no_such_benchmark"]) == 2


def test_a_name_runs_that_benchmarks_main_with_the_arguments_after_it(monkeypatch):
    seen = {}

    def fake_main(argv=None):
        import sys

        seen["argv"] = list(sys.argv)
        return 3

    module = importlib.import_module("bench.prefix_cache")
    monkeypatch.setattr(module, "main", fake_main)
    monkeypatch.setattr("sys.argv", ["python -m bench"])
    assert cli.main(["prefix_cache", "--repeats", "2"]) == 3
    assert seen["argv"] == ["python -m bench prefix_cache", "--repeats", "2"]


def _source(module: str) -> str:
    return (BENCH_DIR.parent / (module.replace(".", "/") + ".py")).read_text()
