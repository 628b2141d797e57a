"""The quantization benchmark's own helpers measure what they claim (tiny model, fast)."""
from __future__ import annotations

import torch

from bench.quantization_batch import batched_greedy
from bench.quantization_quality import free_running, teacher_forced
from core.settings import load_settings
from engine.forward import Qwen2Forward
from engine.kv_cache import ContiguousKVCache
from engine.loader import load_model
from engine.quant.model import quantize_weights
from engine.weights import fuse_projections


def _greedy_alone(forward: Qwen2Forward, ids: list[int], steps: int) -> list[int]:
    cache = ContiguousKVCache(forward.config, len(ids) + steps + 1, forward.weights.dtype, forward.weights.device)
    with torch.inference_mode():
        logits = forward(torch.tensor(ids), cache)
        out = []
        for _ in range(steps + 1):
            out.append(int(logits[-1].argmax()))
            logits = forward(torch.tensor(out[-1:]), cache)
    return out


def test_batched_decode_matches_each_sequence_alone(quant_model_dir):
    loaded = load_model(load_settings(model=str(quant_model_dir), dtype="float32", device="cpu", quant="none"))
    forward = Qwen2Forward(fuse_projections(loaded.model))
    prompts = [[5, 9, 30, 7], [11, 12], [40, 41, 42, 43, 44, 45]]  # different lengths
    result = batched_greedy(forward, prompts, steps=6)
    assert result["tokens"] == [_greedy_alone(forward, ids, 6) for ids in prompts]
    assert result["decode_tps"] > 0


def test_agreement_measures(quant_model_dir):
    assert free_running([[1, 2, 3], [4, 5]], [[1, 9, 3], [4, 5]]) == {
        "agree_free": 4 / 5, "identical": 1, "first_diff_mean": 1.5}
    loaded = load_model(load_settings(model=str(quant_model_dir), dtype="float32", device="cpu", quant="none"))
    weights = fuse_projections(loaded.model)
    forward = Qwen2Forward(weights)
    prompts = [[5, 9, 30, 7], [11, 12]]
    reference = [_greedy_alone(forward, ids, 5) for ids in prompts]
    assert teacher_forced(forward, prompts, reference) == 1.0
    quantized = Qwen2Forward(quantize_weights(weights, "q8")[0])
    assert 0.0 <= teacher_forced(quantized, prompts, reference) <= 1.0


def test_bytes_per_token_counts_what_a_step_reads(quant_model_dir):
    from engine.quant.model import bytes_per_token, quantized_bytes

    loaded = load_model(load_settings(model=str(quant_model_dir), dtype="bfloat16", device="cpu", quant="none"))
    weights = fuse_projections(loaded.model)
    full = bytes_per_token(weights)
    linear = sum(m.weight.numel() * 2 for n, m in loaded.model.named_modules()
                 if isinstance(m, torch.nn.Linear))
    embed_row = weights.embed.shape[1] * 2
    assert linear + embed_row < full < linear + embed_row + 64 * 1024  # + norms and biases
    low = quantize_weights(weights, "q8")[0]
    assert bytes_per_token(low) < full / 1.5
    assert bytes_per_token(low) >= quantized_bytes(low) - low.embed.nbytes + embed_row // 2  # every low-bit tensor is read once


def test_read_bandwidth_is_a_positive_rate():
    from bench.stats import read_bandwidth_gbs

    gbs = read_bandwidth_gbs(mb=16, repeats=3)
    assert 0.1 < gbs < 10_000


def test_the_bandwidth_probe_releases_its_threads_openmp_team(monkeypatch):
    """It runs on a benchmark's main thread, not the engine loop's: a second OpenMP team left
    behind slowed every engine step that followed (engine.openmp)."""
    from bench.stats import read_bandwidth_gbs

    released = []
    monkeypatch.setattr("engine.openmp.release_thread_team", lambda: released.append(True) or True)
    assert read_bandwidth_gbs(mb=4, repeats=1) > 0
    assert released == [True]


def test_the_largest_reported_cache_sizes_what_reads_from_memory(tmp_path, monkeypatch):
    """A Xeon VM here reports a 480 MB L3: a 64 MB kernel pass or a 512 MB bandwidth probe
    read partly from it, so both grow to twice the largest cache."""
    import bench.stats as stats

    for index, (level, size) in enumerate([("1", "48K"), ("2", "2048K"), ("3", "480M"), ("3", "garbage")]):
        (tmp_path / f"index{index}").mkdir()
        (tmp_path / f"index{index}" / "level").write_text(level)
        (tmp_path / f"index{index}" / "size").write_text(size + "\n")
    assert stats.last_level_cache_bytes(tmp_path) == 480 * 2**20
    assert stats.last_level_cache_bytes(tmp_path / "missing") == 0
    monkeypatch.setattr(stats, "last_level_cache_bytes", lambda: 480 * 2**20)
    assert stats.beyond_cache_mb() == 960
    monkeypatch.setattr(stats, "last_level_cache_bytes", lambda: 32 * 2**20)
    assert stats.beyond_cache_mb() == 512
