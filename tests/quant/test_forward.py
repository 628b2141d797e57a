"""The quantized hand-written forward against the unquantized one, on tiny Qwen2 models."""
from __future__ import annotations

import dataclasses

import pytest
import torch

from core.settings import SettingsError, load_settings
from engine.engine import Engine
from engine.forward import Qwen2Forward
from engine.kv_cache import NoCache
from engine.quant import (QuantizedLinear, exact_attention, forward_weights, full_weight_bytes, quantize_model,
                          quantize_weights)
from engine.types import GenerationRequest, SamplingParams
from engine.weights import fuse_projections

# Relative error of each position's logits (L2 of the difference / L2 of the reference) on the
# tiny random model. int8 per channel: measured ~0.02; int4 groups of 32 on Gaussian random
# weights: ~0.3 (random weights are the worst case for 4 bits, a trained model fares far
# better, see docs/quantization.md); bounds leave margin for the other dtype.
LOGIT_TOLERANCE = {"int8": 0.05, "int4": 0.45, "q8": 0.05}
TEXT = "Hello, world! 你好，世界。The quick brown fox jumps over the lazy dog."
MESSAGES = [{"role": "user", "content": "Write a short poem about the sea."}]


def _engine(model_dir, dtype: str, quant: str = "none") -> Engine:
    return Engine(load_settings(model=str(model_dir), dtype=dtype, device="cpu", quant=quant))


def _greedy(engine: Engine, method: str, tokens: int = 12) -> list[int]:
    request = GenerationRequest(messages=MESSAGES, sampling=SamplingParams(max_new_tokens=tokens), method=method)
    return engine.generate(request).token_ids


def _rel_error(got: torch.Tensor, want: torch.Tensor) -> float:
    return ((got - want).norm(dim=-1) / want.norm(dim=-1)).max().item()


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("mode", ["int8", "int4", "q8"])
def test_quantized_logits_close_to_unquantized(quant_model_dir, dtype, mode):
    engine = _engine(quant_model_dir, dtype)
    weights = fuse_projections(engine.loaded.model)
    ids = torch.tensor(engine.loaded.tokenizer(TEXT)["input_ids"])
    want = Qwen2Forward(weights)(ids, NoCache(), last_only=False)
    # max_rows huge: every row goes through the packed kernel (as single-token decode does)
    quantized, summary = quantize_weights(weights, mode, group_size=32, max_rows=1 << 20)
    got = Qwen2Forward(quantized)(ids, NoCache(), last_only=False)
    assert summary.layers == 2 * 4 + 1 and not summary.fallbacks
    assert not torch.equal(got, want)  # the quantized path really ran
    assert _rel_error(got, want) < LOGIT_TOLERANCE[mode]


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_int8_greedy_equals_unquantized_and_official_is_untouched(quant_model_dir, dtype):
    base = _engine(quant_model_dir, dtype)
    int8 = _engine(quant_model_dir, dtype, "int8")
    reference = _greedy(base, "official")
    assert _greedy(int8, "official") == reference  # official runs the bf16/fp32 weights
    assert _greedy(int8, "custom_cache") == reference
    assert _greedy(int8, "prefix_cache") == reference
    assert isinstance(forward_weights(int8.loaded.model).layers[0].qkv, QuantizedLinear)


def _snap_to_int4_grid(model, group: int = 32) -> None:
    """Put every linear weight on a per-group 4-bit grid, as the default model's weights are
    (they were dequantized from a Q4_K GGUF)."""
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, torch.nn.Linear):
                w = module.weight.float()
                g = w.reshape(w.shape[0], -1, group)
                low, high = g.amin(-1, keepdim=True), g.amax(-1, keepdim=True)
                step = ((high - low) / 15).clamp(min=1e-8)
                snapped = torch.round((g - low) / step) * step + low
                module.weight.copy_(snapped.reshape(w.shape).to(module.weight.dtype))


def test_int4_is_near_exact_on_weights_already_on_a_4bit_grid(quant_model_dir):
    engine = _engine(quant_model_dir, "float32")
    _snap_to_int4_grid(engine.loaded.model)
    reference = _greedy(engine, "official")
    ids = torch.tensor(engine.loaded.tokenizer(TEXT)["input_ids"])
    want = Qwen2Forward(fuse_projections(engine.loaded.model))(ids, NoCache(), last_only=False)
    quantize_model(engine.loaded.model, "int4", group_size=32, free_full=False)
    got = Qwen2Forward(forward_weights(engine.loaded.model))(ids, NoCache(), last_only=False)
    assert _rel_error(got, want) < 0.02  # only bf16 rounding of scales/activations left
    assert _greedy(engine, "custom_cache") == reference


@pytest.mark.parametrize("mode", ["int8", "int4", "mixed", "q8"])
def test_quantized_setting_frees_full_precision_weights(quant_model_dir, mode):
    """Parameter accounting: after load only the low-bit tensors stand for the projections;
    official brings the full-precision ones back on first use, and then matches none."""
    engine = _engine(quant_model_dir, "bfloat16", mode)
    model = engine.loaded.model
    layer = forward_weights(model).layers[0].gate_up
    assert isinstance(layer, QuantizedLinear) and layer.reference is None
    assert full_weight_bytes(model) == 0
    held = sum(p.numel() * p.element_size() for p in model.parameters())
    small = sum(p.numel() * p.element_size() for n, p in model.named_parameters() if "norm" in n or "bias" in n)
    embed = model.model.embed_tokens.weight.numel() * model.model.embed_tokens.weight.element_size()
    assert held == small + embed  # nothing else full precision is left
    assert (embed == 0) == (mode in ("mixed", "q8"))  # these hold the embedding as int8
    many = torch.randn(layer.max_rows + 3, 64, dtype=torch.bfloat16)
    assert torch.allclose(layer(many).float(), torch.nn.functional.linear(many.float(), layer.dequantize()),
                          rtol=2e-2, atol=2e-2)  # many rows: the packed kernel, no bf16 copy
    reference = _greedy(_engine(quant_model_dir, "bfloat16"), "official")
    assert _greedy(engine, "official") == reference
    assert full_weight_bytes(model) > 0  # restored for official only now


def test_quantize_model_none_restores_full_precision(quant_model_dir):
    engine = _engine(quant_model_dir, "float32", "int8")
    model = engine.loaded.model
    assert isinstance(forward_weights(model).lm_head, QuantizedLinear)
    quantize_model(model, "none")
    assert not isinstance(forward_weights(model).lm_head, QuantizedLinear)
    with pytest.raises(ValueError, match="unknown quantization mode"):
        quantize_model(model, "int3")


def test_quant_setting_is_validated(monkeypatch):
    monkeypatch.delenv("MINISERVE_QUANT", raising=False)
    assert load_settings().quant == "auto"
    assert load_settings(quant="INT4").quant == "int4"
    monkeypatch.setenv("MINISERVE_QUANT", "int8")
    assert load_settings().quant == "int8"
    monkeypatch.setenv("MINISERVE_QUANT", "fp8")
    with pytest.raises(SettingsError, match="MINISERVE_QUANT.*'auto', 'none', 'mixed', 'q8', 'int8' or 'int4'"):
        load_settings()


@pytest.mark.parametrize("quant", ["none", "q8"])
def test_only_full_precision_caches_round_attention_like_transformers(quant_model_dir, quant):
    """`none` promises official's greedy tokens, so its contiguous caches keep transformers'
    attention call; a quantized forward takes the faster folded one-token attention."""
    from engine.handwritten import _new_cache, forward_for

    engine = _engine(quant_model_dir, "bfloat16", quant)
    forward = forward_for(engine)
    request = GenerationRequest(messages=MESSAGES, sampling=SamplingParams(max_new_tokens=4))
    cache = _new_cache(forward, engine.prompt(request), request)
    assert exact_attention(forward.weights) is (quant == "none") and cache.exact is (quant == "none")
    assert len(_greedy(engine, "custom_cache", 6)) == 6
    engine.close()


def test_calibration_records_each_projections_inputs_and_the_heads_without_its_logits(quant_model_dir):
    """input_importance: per projection and for lm_head, the mean squared input of each column
    over the calibration texts; the head's inputs are recorded without computing its logits."""
    from engine.quant.calibration import input_importance

    engine = _engine(quant_model_dir, "float32")
    weights = fuse_projections(engine.loaded.model)
    forward = Qwen2Forward(weights)
    ids = torch.tensor(engine.loaded.tokenizer(TEXT)["input_ids"])
    head_calls = []
    watched = dataclasses.replace(weights, lm_head=lambda x: head_calls.append(x) or weights.lm_head(x))
    importance = input_importance(watched, engine.loaded.tokenizer, texts=[TEXT])
    assert not head_calls
    normed = forward.head_input(forward.hidden(ids, NoCache()))
    torch.testing.assert_close(importance["lm_head"], normed.pow(2).mean(0))
    assert len(importance["qkv"]) == len(weights.layers)
    assert importance["qkv"][0].shape == importance["lm_head"].shape == (normed.shape[-1],)
    engine.close()
