"""bench.kernel_ab builds a revision's kernels beside the working tree's and compares them."""
import json

import pytest

from bench import kernel_ab
from engine.quant import native


@pytest.mark.skipif(native.vector_path() == "portable", reason="no vector kernels to compare")
def test_head_against_the_tree_is_bit_identical(tmp_path, monkeypatch):
    monkeypatch.setattr(kernel_ab, "LAYERS", 2)
    monkeypatch.setattr(kernel_ab, "SHAPES", {"small q5": (40, 896, True), "small q8": (36, 544, False)})
    monkeypatch.setattr(kernel_ab, "ROWS", (1, 3))
    monkeypatch.setattr(kernel_ab, "read_bandwidth_gbs", lambda: 1.0)
    assert kernel_ab.main(["--base", "HEAD", "--rounds", "2", "--out", str(tmp_path)]) == 0
    result = json.loads((tmp_path / "kernel_ab.json").read_text())
    assert len(result["rows"]) == 2 * 3 and all(r["identical"] for r in result["rows"])
    assert (tmp_path / "kernel_ab.png").stat().st_size > 0
