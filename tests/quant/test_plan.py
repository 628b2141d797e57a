"""Precision plans, refined rounding, MINISERVE_QUANT=auto and the default setting end to end."""
from __future__ import annotations

import logging

import pytest
import torch

from core.settings import load_settings
from engine.engine import Engine
from engine.handwritten import forward_for
from engine.loader import ModelLoadError, load_model
from engine.quant import QUANT_CHOICES, QuantKernelError, forward_weights, full_weight_bytes, resolve_quant
from engine.quant.mapped import resident_bytes
from engine.quant import q8
from engine.quant.kernels import dequantize_int4, dequantize_int8, quantize_int4
from engine.quant.plan import PLANS, quantize_for
from engine.quant.rounding import refine_int4
from engine.types import GenerationRequest, SamplingParams
from tests.agreement import common_prefix

HANDWRITTEN = ("no_cache", "custom_cache", "prefix_cache", "paged")


def _weight(n: int = 64, k: int = 128, seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(n, k, generator=gen) * 0.05


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).norm() / b.norm()).item()


@pytest.mark.parametrize("fmt,bound", [("int8", 0.01), ("int4", 0.12), ("int4-hqq", 0.12), ("int4-awq", 0.12),
                                       ("q8", 0.006)])
def test_round_trip_per_format(fmt, bound):
    w = _weight()
    importance = torch.rand(128, generator=torch.Generator().manual_seed(1)) if fmt == "int4-awq" else None
    q, params = quantize_for(w, fmt, 32, importance)
    if fmt == "q8":
        back = q8.dequantize(q, params)
    else:
        back = dequantize_int8(q, params) if fmt == "int8" else dequantize_int4(q, params, 32)
    assert back.shape == w.shape and 0 < _rel(back, w) < bound
    if fmt == "q8":
        assert q.dtype == torch.uint8 and params.dtype == torch.float16 and params.shape == (64, 128 // 32)
    elif fmt != "int8":
        assert int(q.min()) >= 0 and int(q.max()) <= 15  # codes fit in 4 bits
        assert params.dtype == torch.bfloat16 and params.shape == (128 // 32, 64, 2)


def test_refined_rounding_never_worse_than_the_level_search():
    w = _weight(seed=3)
    q0, p0 = quantize_int4(w, 32, (15, 14, 13, 12))
    q1, p1 = refine_int4(w, 32)
    err0 = (dequantize_int4(q0, p0, 32) - w).pow(2).reshape(64, 4, 32).sum(-1)
    err1 = (dequantize_int4(q1, p1, 32) - w).pow(2).reshape(64, 4, 32).sum(-1)
    assert bool((err1 <= err0 * (1 + 1e-3) + 1e-12).all())  # per group: kept only when better
    assert err1.sum() < err0.sum()


def test_activation_weighted_rounding_lowers_the_weighted_error():
    w = _weight(seed=4)
    importance = torch.ones(128)
    importance[::8] = 50.0  # a few loud input channels
    plain = dequantize_int4(*refine_int4(w, 32), 32)
    aware = dequantize_int4(*refine_int4(w, 32, importance=importance), 32)
    weighted = lambda got: float((importance * (got - w).pow(2)).sum())  # noqa: E731
    assert weighted(aware) < weighted(plain)


def test_auto_is_q8_for_bf16_on_cpu_and_full_precision_elsewhere():
    assert resolve_quant("auto", "cpu") == "q8" and resolve_quant("auto", "cpu", torch.bfloat16) == "q8"
    assert resolve_quant("auto", "cpu", torch.float32) == "none"     # float32: asked for full precision
    assert resolve_quant("auto", "cuda") == "none" and "mixed" in PLANS
    assert resolve_quant("int8", "cpu") == "int8"
    with pytest.raises(ValueError, match="MINISERVE_QUANT.*auto, none, mixed, q8, int8, int4"):
        resolve_quant("int3", "cpu")
    assert QUANT_CHOICES == ("auto", "none", "mixed", "q8", "int8", "int4")


def _broken_kernels(monkeypatch):
    def broken(mode, device="cpu"):
        raise QuantKernelError(f"MINISERVE_QUANT={mode} needs torch.ops.aten._weight_int4pack_mm_for_cpu")
    monkeypatch.setattr("engine.quant.model.check_kernels", broken)


def test_explicit_setting_without_its_kernel_fails_at_start(quant_model_dir, monkeypatch):
    _broken_kernels(monkeypatch)
    with pytest.raises(ModelLoadError, match="MINISERVE_QUANT.*one of auto, none, mixed, q8, int8, int4"):
        load_model(load_settings(model=str(quant_model_dir), device="cpu", quant="int4"))


def test_auto_without_its_kernel_runs_full_precision_and_says_so(quant_model_dir, monkeypatch, caplog):
    monkeypatch.setattr("engine.quant.plan.AUTO_CPU_PLAN", "mixed")  # as when a plan passes the gate
    _broken_kernels(monkeypatch)
    with caplog.at_level(logging.WARNING, logger="miniserve.engine.loader"):
        engine = Engine(load_settings(model=str(quant_model_dir), device="cpu", quant="auto")).load()
    assert engine.info()["quant"].startswith("none (auto: mixed kernel unavailable")
    assert any("quant_fallback" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("plan", ["mixed", "q8"])
def test_every_handwritten_method_runs_under_each_low_bit_plan(quant_model_dir, plan, tmp_path):
    engine = Engine(load_settings(model=str(quant_model_dir), device="cpu", dtype="bfloat16",
                                  quant=plan, cache_dir=tmp_path)).load()
    assert engine.info()["quant"] == plan and full_weight_bytes(engine.loaded.model) == 0
    # the quantized embedding is read from a mapped file under the cache dir, not the heap
    embed = forward_weights(engine.loaded.model).embed
    assert resident_bytes(embed.qweight) is not None and len(list((tmp_path / "tables").glob("*.bin"))) == 1
    request = lambda method: GenerationRequest(  # noqa: E731
        messages=[{"role": "user", "content": "Write a short poem about the sea."}],
        sampling=SamplingParams(max_new_tokens=10), method=method)
    outputs = {m: engine.generate(request(m)).token_ids for m in HANDWRITTEN}
    assert all(len(ids) == 10 for ids in outputs.values())
    # with torch's small operations everywhere the methods agree (bit for bit on the CPUs
    # measured). Low-bit results are not promised alike across code paths (no_cache runs
    # prefill-sized calls, which may take another kernel), so: a floor a broken cache breaks.
    engine.loop.call(lambda: setattr(forward_for(engine), "fused", False))
    outputs = {m: engine.generate(request(m)).token_ids for m in HANDWRITTEN}
    assert all(common_prefix(ids, outputs["custom_cache"]) >= 5 for ids in outputs.values()), outputs
    assert engine.generate(request("official")).finish_reason == "length"


@pytest.mark.parametrize("c_attention", [True, False])
def test_a_fused_forward_attends_in_c_only_with_c_attention(quant_model_dir, tmp_path, monkeypatch, c_attention):
    import engine.fused as fused_ops
    import engine.kv_cache as kv_cache

    engine = Engine(load_settings(model=str(quant_model_dir), device="cpu", dtype="bfloat16",
                                  quant="q8", cache_dir=tmp_path)).load()
    forward = engine.loop.call(lambda: forward_for(engine))
    # the per-operation path (the one-call step, engine.quant.step, has its own tests)
    engine.loop.call(lambda: (setattr(forward, "c_attention", c_attention), setattr(forward, "one_call_step", False)))
    calls = {"rms_norm": 0, "attend_decode": 0, "silu_mul": 0}

    def counting(module, name):
        original = getattr(module, name)

        def wrapper(*args, **kwargs):
            calls[name] += 1
            return original(*args, **kwargs)
        monkeypatch.setattr(module, name, wrapper)
    counting(fused_ops, "rms_norm"), counting(kv_cache, "attend_decode"), counting(fused_ops, "silu_mul")
    engine.generate(GenerationRequest(messages=[{"role": "user", "content": "Hi"}], method="custom_cache",
                                      sampling=SamplingParams(max_new_tokens=3)))
    assert forward.fused and calls["silu_mul"] > 0 and calls["rms_norm"] > 0
    assert (calls["attend_decode"] > 0) == c_attention
