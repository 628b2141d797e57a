"""The non-timing parts of ``python -m bench.models --sizes``: the shape table, the bandwidth-floor
arithmetic, where built files go, and the report's reading of a small results file."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.bandwidth_floor import TensorBytes, floor_tps, pct_of_floor, token_bytes
from bench.model_build import gguf_path, remove_leftovers
from bench.model_shapes import DEFAULT_SIZES, ON_REQUEST, SHAPES, hf_config, param_count, resolve
from bench.model_sizes import add_floor, flat_rows, ours_command
from bench.report_figures import Figures
from bench.report_sizes import add_sizes

# The parameter counts the model cards publish (tied output matrices counted once).
PUBLISHED_B = {"qwen2.5-0.5b": 0.49, "qwen2.5-1.5b": 1.54, "qwen2.5-3b": 3.09,
               "llama3.2-1b": 1.24, "llama3.2-3b": 3.21, "llama3.1-8b": 8.03}


@pytest.mark.parametrize("name", sorted(PUBLISHED_B))
def test_each_shape_has_its_published_parameter_count(name):
    assert param_count(SHAPES[name]) / 1e9 == pytest.approx(PUBLISHED_B[name], abs=0.006)


def test_the_config_carries_the_shape_transformers_builds():
    config = hf_config(SHAPES["llama3.2-3b"])
    assert (config["hidden_size"], config["intermediate_size"], config["num_hidden_layers"]) == (3072, 8192, 28)
    assert (config["num_attention_heads"], config["num_key_value_heads"], config["head_dim"]) == (24, 8, 128)
    assert config["vocab_size"] == 128256 and config["tie_word_embeddings"] is True
    assert config["rope_scaling"]["rope_type"] == "llama3"
    qwen = hf_config(SHAPES["qwen2.5-1.5b"])
    assert qwen["model_type"] == "qwen2" and qwen["rope_theta"] == 1e6 and "rope_scaling" not in qwen


def test_the_8b_shape_is_built_only_on_request():
    assert "llama3.1-8b" not in DEFAULT_SIZES and "llama3.1-8b" in ON_REQUEST
    assert [s.name for s in resolve(["qwen2.5-0.5b"], with_8b=True)] == ["qwen2.5-0.5b", "llama3.1-8b"]
    with pytest.raises(SystemExit, match="qwen9"):
        resolve(["qwen9"], with_8b=False)


def test_cached_files_are_keyed_by_shape_and_type(tmp_path):
    a = gguf_path(tmp_path, SHAPES["qwen2.5-0.5b"], "q4_k_m")
    assert a.parent == tmp_path / "sizes" and a.name.endswith("-Q4_K_M.gguf")
    assert a != gguf_path(tmp_path, SHAPES["qwen2.5-0.5b"], "Q8_0")
    assert a != gguf_path(tmp_path, SHAPES["qwen2.5-1.5b"], "Q4_K_M")
    assert SHAPES["qwen2.5-0.5b"].key() != SHAPES["qwen2.5-1.5b"].key()


def _tensors(tied: bool) -> list[TensorBytes]:
    out = [TensorBytes("token_embd.weight", 1000 * 100, 1000), TensorBytes("blk.0.ffn_up.weight", 5000, 10)]
    return out if tied else out + [TensorBytes("output.weight", 2000, 1000)]


def test_a_killed_builds_leftovers_of_the_same_shape_are_removed(tmp_path):
    qwen, llama = SHAPES["qwen2.5-1.5b"], SHAPES["llama3.2-1b"]
    sizes = gguf_path(tmp_path, qwen, "Q4_K_M").parent
    (sizes / f".build-{qwen.name}-x1" / "hf").mkdir(parents=True)
    (sizes / f".build-{llama.name}-x2").mkdir()
    gguf_path(tmp_path, qwen, "Q4_K_M").with_suffix(".partial").write_bytes(b"half")
    gguf_path(tmp_path, qwen, "Q8_0").write_bytes(b"whole")
    remove_leftovers(sizes, qwen)
    assert sorted(p.name for p in sizes.iterdir()) == [f".build-{llama.name}-x2", gguf_path(tmp_path, qwen, "Q8_0").name]


def test_a_tied_table_is_read_whole_as_the_output_matrix_plus_one_row():
    tb = token_bytes(_tensors(tied=True))
    assert tb.tied and tb.embedding_row == 100
    assert tb.per_token == 100_000 + 5000 + 100


def test_an_untied_table_costs_one_row_per_token():
    tb = token_bytes(_tensors(tied=False))
    assert not tb.tied and tb.tensors == 107_000
    assert tb.per_token == 5000 + 2000 + 100


def test_floor_is_bandwidth_over_bytes_per_token():
    assert floor_tps(40.0, 500_000_000) == pytest.approx(80.0)
    assert floor_tps(0.0, 500_000_000) == 0.0 and floor_tps(40.0, 0) == 0.0
    assert pct_of_floor(60.0, 80.0) == 75.0 and pct_of_floor(None, 80.0) is None
    with pytest.raises(ValueError, match="token_embd"):
        token_bytes([TensorBytes("blk.0.ffn_up.weight", 5000, 10)])


def _results() -> dict:
    ours = {"b1_tps": 15.0, "b8_tps": 60.0, "pp512_tps": 100.0, "rss_after_load_mb": 2500.0, "rss_runtime_mb": 270.0,
            "peak_load_mb": 3000.0, "ready_s": 12.0, "first_ready_s": 120.0, "first_peak_load_mb": 9000.0}
    llama = {"b1_tps": 30.0, "b8_tps": 40.0, "pp512_tps": 200.0, "rss_after_load_mb": 2000.0,
             "peak_load_mb": 2100.0, "ready_s": 3.0}
    entry = {"model": "qwen2.5-1.5b", "quant": "Q4_K_M", "params_b": 1.544, "file_mb": 1000.0,
             "mb_per_token": 800.0, "MiniServe": ours, "llama.cpp": llama}
    add_floor(entry, 40.0)
    return {"machine": {"cpu_model": "Test CPU", "cpus": 2, "read_bandwidth_gbs": [40.0, 40.0]},
            "command": "python -m bench.models --size qwen2.5-1.5b", "llama_cpp": "llama.cpp test",
            "note": "a busy machine", "clients": 8, "files": [entry]}


def test_add_floor_gives_each_side_its_share_of_the_floor():
    entry = _results()["files"][0]
    assert entry["floor_tps"] == 50.0
    assert entry["MiniServe"]["b1_pct_of_floor"] == 30.0 and entry["llama.cpp"]["b1_pct_of_floor"] == 60.0
    assert [r["side"] for r in flat_rows([entry])] == ["MiniServe", "llama.cpp"]


def test_a_side_with_its_own_bandwidth_samples_is_measured_against_the_better_one():
    entry = _results()["files"][0]
    entry["MiniServe"]["bandwidth_gbs"] = [20.0, 30.0]   # the floor at 30 GB/s: 37.5 tok/s
    add_floor(entry, 40.0)
    assert entry["floor_tps"] == 50.0
    assert entry["MiniServe"]["b1_pct_of_floor"] == 40.0 and entry["llama.cpp"]["b1_pct_of_floor"] == 60.0


def test_the_report_shows_both_sides_and_their_ratios(tmp_path: Path):
    (tmp_path / "results").mkdir()
    (tmp_path / "results/model_sizes.json").write_text(json.dumps(_results()))
    figures = Figures(["x"], [])
    add_sizes(figures, tmp_path)
    (_, _, sides), (_, _, ratios) = figures.tables
    assert [r[3] for r in sides] == ["MiniServe", "llama.cpp"]
    ours = sides[0]
    assert ours[4:8] == ["15.0", "30", "60.0", "100.0"] and "first start 9000" in ours[9] and "120.0" in ours[10]
    assert ours[8] == "2500 (270 before the model)" and sides[1][8] == "2000"
    assert any("RSS before it opens the model" in note for note in figures.notes)
    assert ratios == [["qwen2.5-1.5b", "Q4_K_M", "MiniServe", "800", "50.0", "0.50x", "1.50x", "0.50x", "1.25x", "3.00x"]]
    assert any("a busy machine" in note for note in figures.notes)
    assert "0.50x llama-bench" in figures.headline[0] and "1.50x llama-server" in figures.headline[0]


def test_other_hosts_results_follow_as_their_own_tables_without_a_headline(tmp_path: Path):
    (tmp_path / "results/model_sizes.json").parent.mkdir(parents=True)
    (tmp_path / "results/model_sizes.json").write_text(json.dumps(_results()))
    for folder, b1, note in (("xeon", 45.0, "a Xeon host"), ("avx2", 30.0, "an AVX2 host")):
        other = _results()
        other["files"][0]["MiniServe"]["b1_tps"] = b1
        other["note"] = note
        (tmp_path / f"results/{folder}").mkdir()
        (tmp_path / f"results/{folder}/model_sizes.json").write_text(json.dumps(other))
    figures = Figures(["x"], [])
    add_sizes(figures, tmp_path)
    assert len(figures.tables) == 6 and len(figures.headline) == 1
    (avx2, _, avx2_sides), (_, _, avx2_ratios), (xeon, _, xeon_sides), (_, _, xeon_ratios) = figures.tables[2:]
    assert avx2.startswith("On a host without AVX-512: ") and avx2_sides[0][4] == "30.0" and avx2_ratios[0][5] == "1.00x"
    assert xeon.startswith("On an Intel Xeon host") and xeon_sides[0][4] == "45.0" and xeon_ratios[0][5] == "1.50x"
    assert any("without AVX-512, run note: an AVX2 host" in note for note in figures.notes)
    assert any("Intel Xeon host, run note: a Xeon host" in note for note in figures.notes)


def test_the_headline_says_when_drift_put_a_side_above_its_floor(tmp_path: Path):
    (tmp_path / "results").mkdir()
    results = _results()
    results["files"][0]["MiniServe"]["bandwidth_gbs"] = [10.0, 10.0]   # floor 12.5 tok/s, 15 measured
    add_floor(results["files"][0], 40.0)
    (tmp_path / "results/model_sizes.json").write_text(json.dumps(results))
    figures = Figures(["x"], [])
    add_sizes(figures, tmp_path)
    assert "120% of the floor its bandwidth samples give: the host's bandwidth drifted" in figures.headline[0]
    assert "30% of the bandwidth floor" in _headline(tmp_path, _results())


def _headline(root: Path, results: dict) -> str:
    (root / "results/model_sizes.json").write_text(json.dumps(results))
    figures = Figures(["x"], [])
    add_sizes(figures, root)
    return figures.headline[0]


def _rounds_args(rounds: int = 3):
    from argparse import Namespace

    return Namespace(skip_ours=False, skip_llama=False, ours_quant=["auto"], b1_rounds=rounds,
                     llama_bin="/nowhere", threads=2, tokens=64)


def test_batch1_rounds_take_turns_flipping_the_order_and_keep_each_sides_median(monkeypatch, tmp_path):
    import bench.model_sizes as sizes
    import bench.model_sizes_llama as llama

    turns, bandwidth = [], iter([40.0, 20.0, 30.0, 30.0, 10.0, 10.0, 50.0, 50.0, 40.0, 40.0, 20.0, 20.0])
    ours_tps, llama_tps = iter([20.0, 10.0, 16.0]), iter([25.0, 5.0, 20.0])
    monkeypatch.setattr(sizes, "child", lambda command, env: turns.append(("ours", command[-1])) or
                        {"b1_tps": next(ours_tps)})
    monkeypatch.setattr(llama, "text_generation", lambda *a: turns.append(("llama", None)) or next(llama_tps))
    monkeypatch.setattr(sizes, "read_bandwidth_gbs", lambda mb: next(bandwidth))
    entry = {"model": "m", "quant": "Q4_K_M", "mb_per_token": 1000.0, "MiniServe": {"b1_tps": 99.0},
             "llama.cpp": {"b1_tps": 1.0}}
    samples: list[float] = []
    sizes.batch1_rounds(entry, tmp_path / "m.gguf", _rounds_args(), tmp_path, samples)
    assert turns == [("ours", "--batch1-only"), ("llama", None), ("llama", None), ("ours", "--batch1-only"),
                     ("ours", "--batch1-only"), ("llama", None)]
    ours, other = entry["MiniServe"], entry["llama.cpp"]
    assert ours["b1_rounds"] == [20.0, 10.0, 16.0] and ours["b1_tps"] == 16.0 and ours["b1_main_tps"] == 99.0
    assert other["b1_rounds"] == [25.0, 5.0, 20.0] and other["b1_tps"] == 20.0
    assert ours["b1_round_bandwidth_gbs"] == [[40.0, 20.0], [50.0, 50.0], [40.0, 40.0]] and len(samples) == 12
    add_floor(entry, 40.0)
    # each round's share at its own better sample (1 GB a token: the floor in tok/s is the GB/s):
    # ours 20/40, 10/50, 16/40; llama.cpp 25/30, 5/10, 20/20
    assert ours["b1_pct_of_floor"] == 40.0 and other["b1_pct_of_floor"] == 83.3


def test_batch1_rounds_need_two_sides_and_stop_cleanly_when_a_turn_fails(monkeypatch, tmp_path):
    import bench.model_sizes as sizes
    import bench.model_sizes_llama as llama

    monkeypatch.setattr(sizes, "read_bandwidth_gbs", lambda mb: 40.0)
    monkeypatch.setattr(sizes, "child", lambda command, env: {"b1_tps": 10.0})
    monkeypatch.setattr(llama, "text_generation", lambda *a: (_ for _ in ()).throw(RuntimeError("llama-bench died")))
    lone = {"model": "m", "quant": "Q4_K_M", "MiniServe": {"b1_tps": 9.0}, "llama.cpp": {"error": "no binary"}}
    sizes.batch1_rounds(lone, tmp_path / "m.gguf", _rounds_args(), tmp_path, [])
    assert "b1_rounds" not in lone["MiniServe"]   # llama.cpp's side failed: nothing to take turns with
    both = {"model": "m", "quant": "Q4_K_M", "MiniServe": {"b1_tps": 9.0}, "llama.cpp": {"b1_tps": 8.0}}
    sizes.batch1_rounds(both, tmp_path / "m.gguf", _rounds_args(), tmp_path, [])
    assert both["MiniServe"] == {"b1_tps": 9.0} and "llama-bench died" in both["b1_rounds_error"]


def test_the_report_takes_batch1_from_the_rounds_and_says_so(tmp_path: Path):
    (tmp_path / "results").mkdir()
    results = _results()
    entry = results["files"][0]
    entry["MiniServe"].update(b1_tps=20.0, b1_rounds=[20.0, 10.0, 30.0], b1_round_bandwidth_gbs=[[40.0]] * 3)
    entry["llama.cpp"].update(b1_tps=25.0, b1_rounds=[10.0, 25.0, 25.0], b1_round_bandwidth_gbs=[[40.0]] * 3)
    (tmp_path / "results/model_sizes.json").write_text(json.dumps(results))
    figures = Figures(["x"], [])
    add_sizes(figures, tmp_path)
    (_, _, _), (_, _, ratios) = figures.tables
    assert ratios[0][5] == "0.80x" and "0.80x llama-bench" in figures.headline[0]
    assert any("batch 1 was measured again in 3 rounds" in note for note in figures.notes)


def test_batch8_is_the_median_of_three_measured_rounds_after_a_warm_one():
    import threading

    from bench.served_clients import Outcome, median_throughput

    calls, lock = [], threading.Lock()

    def one(client: int, round_: int) -> Outcome:
        with lock:
            calls.append(client)
        return Outcome(ttft_s=0.0, tokens=64)

    out = median_throughput(8, one)
    assert len(calls) == 8 * 4 and sorted(set(calls)) == list(range(8))   # a warm round, then 3
    assert len(out["b8_rounds"]) == 3 and out["b8_tokens"] == 8 * 64
    assert out["b8_tps"] == sorted(out["b8_rounds"])[1]


def test_each_setting_keeps_its_own_prepared_folder(tmp_path: Path):
    """q8 prepares weights that gguf does not: a shared folder made a q8 start after a gguf run
    look like a second start."""
    from types import SimpleNamespace

    args = SimpleNamespace(threads=2, tokens=64)
    folders = {quant: ours_command(tmp_path / "m-Q4_K_M.gguf", args, tmp_path, quant) for quant in ("q8", "gguf")}
    for quant, (command, env) in folders.items():
        assert env["MINISERVE_QUANT"] == quant
        assert command[command.index("--cache-dir") + 1] == str(tmp_path / "sizes" / f".ours-{quant}-m-Q4_K_M")


def test_no_results_file_adds_nothing(tmp_path: Path):
    figures = Figures(["x"], [])
    add_sizes(figures, tmp_path)
    assert figures.tables == [] and figures.notes == [] and figures.headline == []


def test_a_side_this_run_does_not_measure_keeps_the_earlier_runs_figures_for_the_same_file():
    from argparse import Namespace

    from bench.model_sizes import carry

    old = {"gguf": "a.gguf", "llama.cpp": {"b1_tps": 30.0}, "MiniServe": {"b1_tps": 15.0}}
    entry = {"gguf": "a.gguf"}
    carry(entry, old, Namespace(skip_ours=False, skip_llama=True, ours_quant=["auto"]))
    assert entry == {"gguf": "a.gguf", "llama.cpp": {"b1_tps": 30.0}, "carried": ["llama.cpp"]}
    settings = {"gguf": "a.gguf", "MiniServe q8": {"b1_tps": 20.0}, "MiniServe gguf": {"b1_tps": 25.0}}
    gguf_only = {"gguf": "a.gguf"}  # a run of one setting keeps the other's figures
    carry(gguf_only, settings, Namespace(skip_ours=False, skip_llama=False, ours_quant=["gguf"]))
    assert gguf_only == {"gguf": "a.gguf", "MiniServe q8": {"b1_tps": 20.0}, "carried": ["MiniServe q8"]}
    rebuilt = {"gguf": "b.gguf"}  # another file (the shape changed): nothing carried over
    carry(rebuilt, old, Namespace(skip_ours=True, skip_llama=True, ours_quant=["auto"]))
    assert rebuilt == {"gguf": "b.gguf"}


def test_random_weights_are_written_a_shard_at_a_time_with_an_index(tmp_path, monkeypatch):
    import bench.model_build as build
    import torch
    from safetensors.torch import load_file

    monkeypatch.setattr(build, "SHARD_BYTES", 1500)
    parameters = [("embed.weight", (40, 16)), ("layers.0.norm.weight", (16,)), ("layers.0.q.bias", (16,)),
                  ("layers.0.q.weight", (16, 16)), ("lm_head.weight", (40, 16))]
    build._write_shards(parameters, tmp_path, torch.Generator().manual_seed(0))
    index = json.loads((tmp_path / "model.safetensors.index.json").read_text())["weight_map"]
    assert sorted(index) == sorted(name for name, _ in parameters)
    shards = sorted(set(index.values()))
    assert len(shards) == 3 and all(s.endswith(f"-of-{len(shards):05d}.safetensors") for s in shards)
    loaded = {k: v for shard in shards for k, v in load_file(tmp_path / shard).items()}
    assert {k: tuple(v.shape) for k, v in loaded.items()} == dict(parameters)
    assert all(v.dtype == torch.bfloat16 for v in loaded.values())
    assert torch.equal(loaded["layers.0.norm.weight"], torch.ones(16, dtype=torch.bfloat16))
    assert not loaded["layers.0.q.bias"].any()
    assert 0.015 < loaded["embed.weight"].float().std() < 0.025
