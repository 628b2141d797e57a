"""MINISERVE_QUANT=auto, a missing kernel at start, and the q8 plan end to end."""
from __future__ import annotations

import logging

import pytest
import torch

from core.settings import load_settings
from engine.engine import Engine
from engine.handwritten import forward_for
from engine.loader import ModelLoadError, load_model
from engine.ops.fused_ops import CAttentionOps, FusedOps
from engine.ops.torch_ops import TorchOps
from engine.quant.plan import QUANT_CHOICES, auto_runs_gguf, resolve_quant
from engine.quant.kernels import QuantKernelError
from engine.quant.model import forward_weights
from engine.quant.restore import full_weight_bytes
from engine.quant.mapped import resident_bytes
from engine.types import GenerationRequest, SamplingParams
from tests.agreement import common_prefix

HANDWRITTEN = ("no_cache", "custom_cache", "prefix_cache", "paged")


def test_auto_is_q8_for_bf16_on_cpu_and_full_precision_elsewhere():
    assert resolve_quant("auto", "cpu") == "q8" and resolve_quant("auto", "cpu", torch.bfloat16) == "q8"
    assert resolve_quant("auto", "cpu", torch.float32) == "none"     # float32: asked for full precision
    assert resolve_quant("auto", "cuda") == "none"
    assert resolve_quant("q8", "cpu") == "q8" and resolve_quant("none", "cpu") == "none"
    for removed in ("int8", "int4", "mixed", "int3"):
        with pytest.raises(ValueError, match="MINISERVE_QUANT.*auto, none, q8"):
            resolve_quant(removed, "cpu")
    assert QUANT_CHOICES == ("auto", "none", "q8", "gguf")


def test_auto_runs_a_gguf_natively_only_behind_its_switch(monkeypatch):
    from engine.quant import plan

    assert auto_runs_gguf("gguf", "cpu", torch.float32)              # asked for: always
    assert not auto_runs_gguf("q8", "cpu", torch.bfloat16) and not auto_runs_gguf("none", "cpu", torch.bfloat16)
    assert auto_runs_gguf("auto", "cpu", torch.bfloat16) == plan.AUTO_GGUF
    monkeypatch.setattr(plan, "AUTO_GGUF", True)
    assert auto_runs_gguf("auto", "cpu", torch.bfloat16)
    assert not auto_runs_gguf("auto", "cpu", torch.float32) and not auto_runs_gguf("auto", "cuda", torch.bfloat16)


def _index(*tensors: tuple[str, int, int]):
    from types import SimpleNamespace

    from gguf import GGMLQuantizationType as T

    from engine.gguf_index import TensorInfo

    infos = {name: TensorInfo(name, T[kind], (cols, rows), 0) for name, (kind, rows, cols) in
             ((f"t{i}", t) for i, t in enumerate(tensors))}
    return SimpleNamespace(tensors=infos)


def test_auto_runs_k_format_files_natively_and_leaves_32_input_blocks_to_q8_while_q8_fits():
    from engine.gguf_weights import auto_declines

    k_file = _index(("Q4_K", 8960, 1536), ("Q6_K", 1536, 8960), ("Q5_0", 128, 1536))  # a 1.5B Q4_K_M
    small_blocks = _index(("Q5_0", 4864, 896), ("Q8_0", 151936, 896), ("Q4_K", 896, 4864))  # the default's mix
    plenty, little = 64 * 2**30, 2**29   # the mix holds 0.14B parameters: ~1 GB for q8 to prepare
    assert auto_declines(k_file, plenty) is None and auto_declines(k_file, None) is None
    assert "K formats" in auto_declines(small_blocks, plenty)       # q8's kernels are faster on these
    assert auto_declines(small_blocks, None) is not None              # memory unknown: as measured
    assert auto_declines(small_blocks, little) is None                # q8's preparation would not fit


def _broken_kernels(monkeypatch):
    def broken(mode, device="cpu"):
        raise QuantKernelError(f"MINISERVE_QUANT={mode} needs our C kernel: no C compiler")
    monkeypatch.setattr("engine.quant.model.check_kernels", broken)


def test_explicit_setting_without_its_kernel_fails_at_start(quant_model_dir, monkeypatch):
    _broken_kernels(monkeypatch)
    with pytest.raises(ModelLoadError, match="MINISERVE_QUANT.*one of auto, none, q8"):
        load_model(load_settings(model=str(quant_model_dir), device="cpu", quant="q8"))


def test_auto_without_its_kernel_runs_full_precision_and_says_so(quant_model_dir, monkeypatch, caplog):
    _broken_kernels(monkeypatch)
    with caplog.at_level(logging.WARNING, logger="miniserve.engine.loader"):
        engine = Engine(load_settings(model=str(quant_model_dir), device="cpu", quant="auto")).load()
    assert engine.info()["quant"].startswith("none (auto: q8 kernel unavailable")
    assert any("quant_fallback" in r.getMessage() for r in caplog.records)


def test_every_handwritten_method_runs_under_q8(quant_model_dir, tmp_path):
    plan = "q8"
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
    engine.loop.call(lambda: setattr(forward_for(engine), "ops", TorchOps(exact=False)))
    outputs = {m: engine.generate(request(m)).token_ids for m in HANDWRITTEN}
    assert all(common_prefix(ids, outputs["custom_cache"]) >= 5 for ids in outputs.values()), outputs
    assert engine.generate(request("official")).finish_reason == "length"


@pytest.mark.parametrize("c_attention", [True, False])
def test_a_fused_forward_attends_in_c_only_with_c_attention(quant_model_dir, tmp_path, monkeypatch, c_attention):
    import engine.ops.c_calls as c_calls

    engine = Engine(load_settings(model=str(quant_model_dir), device="cpu", dtype="bfloat16",
                                  quant="q8", cache_dir=tmp_path)).load()
    forward = engine.loop.call(lambda: forward_for(engine))
    # the per-operation path (the one-call step, engine.quant.step, has its own tests)
    ops = CAttentionOps() if c_attention else FusedOps()
    engine.loop.call(lambda: (setattr(forward, "ops", ops), setattr(forward, "one_call_step", False)))
    calls = {"rms_norm": 0, "attend_decode": 0, "silu_mul": 0}

    def counting(module, name):
        original = getattr(module, name)

        def wrapper(*args, **kwargs):
            calls[name] += 1
            return original(*args, **kwargs)
        monkeypatch.setattr(module, name, wrapper)
    counting(c_calls, "rms_norm"), counting(c_calls, "attend_decode"), counting(c_calls, "silu_mul")
    engine.generate(GenerationRequest(messages=[{"role": "user", "content": "Hi"}], method="custom_cache",
                                      sampling=SamplingParams(max_new_tokens=3)))
    assert calls["silu_mul"] > 0 and calls["rms_norm"] > 0
    assert (calls["attend_decode"] > 0) == c_attention
