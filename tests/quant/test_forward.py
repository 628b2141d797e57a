"""The quantized hand-written forward against the unquantized one, on tiny Qwen2 models."""
from __future__ import annotations

import dataclasses

import pytest
import torch

from core.settings import SettingsError, load_settings
from engine.engine import Engine
from engine.forward import Qwen2Forward
from engine.kv_cache import NoCache
from engine.quant.layer import QuantizedLinear
from engine.quant.model import exact_attention, forward_weights, quantize_model, quantize_weights
from engine.quant.restore import full_weight_bytes
from engine.types import GenerationRequest, SamplingParams
from engine.weights import fuse_projections

# Relative error of each position's logits (L2 of the difference / L2 of the reference) on the
# tiny random model; the bound leaves margin for the other dtype.
LOGIT_TOLERANCE = 0.05
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
def test_quantized_logits_close_to_unquantized(quant_model_dir, dtype):
    engine = _engine(quant_model_dir, dtype)
    weights = fuse_projections(engine.loaded.model)
    ids = torch.tensor(engine.loaded.tokenizer(TEXT)["input_ids"])
    want = Qwen2Forward(weights)(ids, NoCache(), last_only=False)
    quantized, summary = quantize_weights(weights, "q8")
    got = Qwen2Forward(quantized)(ids, NoCache(), last_only=False)
    assert summary.layers == 2 * 4 + 1
    assert not torch.equal(got, want)  # the quantized path really ran
    assert _rel_error(got, want) < LOGIT_TOLERANCE


def test_quantized_setting_frees_full_precision_weights(quant_model_dir):
    """Parameter accounting: after load only the low-bit tensors stand for the projections;
    official brings the full-precision ones back on first use, and then matches none."""
    engine = _engine(quant_model_dir, "bfloat16", "q8")
    model = engine.loaded.model
    layer = forward_weights(model).layers[0].gate_up
    assert isinstance(layer, QuantizedLinear)
    assert full_weight_bytes(model) == 0
    held = sum(p.numel() * p.element_size() for p in model.parameters())
    small = sum(p.numel() * p.element_size() for n, p in model.named_parameters() if "norm" in n or "bias" in n)
    embed = model.model.embed_tokens.weight.numel() * model.model.embed_tokens.weight.element_size()
    assert held == small and embed == 0  # nothing else full precision is left (the embedding: q8)
    many = torch.randn(11, 64, dtype=torch.bfloat16)
    assert torch.allclose(layer(many).float(), torch.nn.functional.linear(many.float(), layer.dequantize()),
                          rtol=2e-2, atol=2e-2)  # many rows: the packed kernel, no bf16 copy
    reference = _greedy(_engine(quant_model_dir, "bfloat16"), "official")
    assert _greedy(engine, "official") == reference  # on the reloaded full-precision weights
    assert full_weight_bytes(model) == 0  # and freed again once official ended
    assert _greedy(engine, "official") == reference and full_weight_bytes(model) == 0  # reloaded per job


def test_official_keeps_the_reloaded_weights_when_asked(quant_model_dir):
    engine = Engine(load_settings(model=str(quant_model_dir), dtype="bfloat16", device="cpu", quant="q8",
                                  official_keep_weights=True))
    assert full_weight_bytes(engine.loaded.model) == 0
    _greedy(engine, "official")
    assert full_weight_bytes(engine.loaded.model) > 0


def test_quantize_model_none_restores_full_precision(quant_model_dir):
    engine = _engine(quant_model_dir, "bfloat16", "q8")
    model = engine.loaded.model
    assert isinstance(forward_weights(model).lm_head, QuantizedLinear)
    quantize_model(model, "none")
    assert not isinstance(forward_weights(model).lm_head, QuantizedLinear)
    with pytest.raises(ValueError, match="unknown quantization mode"):
        quantize_model(model, "int3")


def test_quant_setting_is_validated(monkeypatch):
    monkeypatch.delenv("MINISERVE_QUANT", raising=False)
    assert load_settings().quant == "auto"
    assert load_settings(quant="Q8").quant == "q8"
    monkeypatch.setenv("MINISERVE_QUANT", "none")
    assert load_settings().quant == "none"
    for removed in ("int8", "int4", "mixed", "fp8"):
        monkeypatch.setenv("MINISERVE_QUANT", removed)
        with pytest.raises(SettingsError, match="MINISERVE_QUANT.*'auto', 'none', 'q8' or 'gguf'"):
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
