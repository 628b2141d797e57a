"""Every supported architecture, as a tiny random model built from a config here: greedy
tokens of every method equal transformers ``generate`` (``official``) in float32, q8 agrees
with float32 above a floor, and an unsupported architecture is a start error naming it."""
from __future__ import annotations

import dataclasses
import threading

import pytest
import torch

from core import grammar
from core.settings import load_settings
from engine.architecture import SUPPORTED, UnsupportedArchitecture
from engine.engine import Engine
from engine.errors import ModelLoadError
from engine.forward import Qwen2Forward
from engine.kv_cache import NoCache
from engine.quant.model import forward_weights
from engine.types import GenerationRequest, SamplingParams
from tests.tiny_model import make_tiny_model_dir

WINDOW = 8   # Mistral's sliding window, far shorter than the prompt
ARCHITECTURES = {
    "qwen3": dict(model_type="qwen3", head_dim=16),
    "llama3-rope-untied": dict(model_type="llama", config_extra={"rope_parameters": {
        "rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0, "low_freq_factor": 1.0,
        "high_freq_factor": 4.0, "original_max_position_embeddings": 64}}),
    "llama-tied-bias-linear-rope": dict(model_type="llama", tie_word_embeddings=True, config_extra={
        "attention_bias": True, "mlp_bias": True,
        "rope_parameters": {"rope_type": "linear", "rope_theta": 10000.0, "factor": 2.0}}),
    "mistral-window": dict(model_type="mistral", config_extra={"sliding_window": WINDOW}),
    "qwen2-window-layer1": dict(model_type="qwen2", config_extra={   # layer_types: layer 1 windowed
        "use_sliding_window": True, "sliding_window": WINDOW, "max_window_layers": 1}),
}
WINDOWED = {"mistral-window": (0, 1), "qwen2-window-layer1": (1,)}
METHODS = ("official", "no_cache", "custom_cache", "prefix_cache", "paged")
USER = [{"role": "user", "content": "你好 world, compute 12 * 3 please"}]
PREFIX = "You are a careful assistant."
Q8_FLOOR = 0.85  # teacher-forced top-1 agreement of q8 with float32 (measured 0.95-1.0 here; printed)


@pytest.fixture(scope="module", params=list(ARCHITECTURES))
def arch(request, tmp_path_factory):
    folder = make_tiny_model_dir(tmp_path_factory.mktemp(request.param), **ARCHITECTURES[request.param])
    engine = Engine(load_settings(model=str(folder), dtype="float32", device="cpu", quant="none",
                                  speculative="ngram"))
    return request.param, folder, engine


def _req(method, speculative=False, constraint=None, tokens=24):
    return GenerationRequest(messages=USER, prefix=PREFIX, method=method, speculative=speculative,
                             constraint=constraint, sampling=SamplingParams(max_new_tokens=tokens))


def test_the_description_is_read_from_the_config(arch):
    name, _, engine = arch
    spec = engine.loaded.spec
    assert spec.model_type == ARCHITECTURES[name]["model_type"]
    assert spec.qk_norm == (name == "qwen3")
    assert (spec.sliding_window, spec.window_layers) == ((WINDOW, WINDOWED[name]) if name in WINDOWED else (None, ()))
    assert spec.rope_type == {"llama3-rope-untied": "llama3", "llama-tied-bias-linear-rope": "linear"}.get(name, "default")
    assert engine.info()["architecture"] == spec.describe()


def test_every_method_gives_generates_greedy_tokens(arch):
    name, _, engine = arch
    official = engine.generate(_req("official"))
    assert len(official.token_ids) >= 8, "too short to compare"
    if name in WINDOWED:   # the window must matter, or this test proves nothing of it
        assert engine.count_prompt_tokens(_req("official")) > 3 * WINDOW
    for method in METHODS[1:]:
        for speculative in (False, True):
            result = engine.generate(_req(method, speculative))
            assert result.token_ids == official.token_ids, (name, method, speculative)
    assert engine.generate(_req("prefix_cache")).usage.cached_tokens > 0   # a hit matches too
    assert engine.generate(_req("prefix_cache")).token_ids == official.token_ids


def test_a_batch_of_different_lengths_gives_each_sequences_solo_tokens(arch):
    """Several sequences in one paged step: each with its own positions, rotary and window."""
    _, _, engine = arch
    texts = ["Hello, world!", "Please compute 12 * (3 + 4) and explain the steps.", "你好，世界！今天天气很好。",
             "Write a short poem about the sea, the wind and the stars at night. " * 2]
    requests = [GenerationRequest(messages=[{"role": "user", "content": t}], method="paged",
                                  sampling=SamplingParams(max_new_tokens=12)) for t in texts]
    solo = [engine.generate(dataclasses.replace(r, method="official")).token_ids for r in requests]
    handles = [engine.loop.submit(r) for r in requests]
    results = [None] * len(handles)
    threads = [threading.Thread(target=lambda i=i: results.__setitem__(i, handles[i].stream(None, lambda: False)))
               for i in range(len(handles))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert [r.token_ids for r in results] == solo
    assert engine.loop.call(engine.loop.stats)["paged"]["max_batch_size"] >= 2


def test_constrained_greedy_tokens_agree_in_every_method(arch):
    _, _, engine = arch
    options = ["yes", "no", "maybe later"]
    texts = {m: engine.generate(_req(m, constraint=grammar.choice(options))).text for m in METHODS}
    assert set(texts.values()) <= set(options) and len(set(texts.values())) == 1, texts


def test_q8_agrees_with_float32_above_a_floor(arch):
    name, folder, engine = arch
    ids = engine.prompt(_req("official")).ids + engine.generate(_req("official")).token_ids
    tokens = torch.tensor(ids)
    reference = Qwen2Forward(forward_weights(engine.loaded.model))(tokens, NoCache(), last_only=False).argmax(-1)
    q8 = Engine(load_settings(model=str(folder), dtype="bfloat16", device="cpu", quant="q8"))
    assert q8.loaded.quant.startswith("q8")
    forward = Qwen2Forward(forward_weights(q8.loaded.model))
    agreement = (forward(tokens, NoCache(), last_only=False).argmax(-1) == reference).float().mean().item()
    print(f"{name}: q8 top-1 agreement with float32 {agreement:.3f} over {len(ids)} positions")
    assert agreement >= Q8_FLOOR
    for method in ("custom_cache", "paged"):   # the q8 serving paths run (fused ops, C attention)
        assert len(q8.generate(_req(method, tokens=8)).token_ids) > 0


@pytest.mark.parametrize("model_type", ["phi3", "gemma"])
def test_an_unsupported_architecture_is_a_start_error_naming_it(tmp_path, model_type):
    from transformers import AutoConfig

    AutoConfig.for_model(model_type, hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                         num_attention_heads=4, num_key_value_heads=2, vocab_size=100).save_pretrained(tmp_path)
    engine = Engine(load_settings(model=str(tmp_path), dtype="float32", device="cpu", quant="none"))
    with pytest.raises(UnsupportedArchitecture) as caught:
        engine.load()
    message = str(caught.value)
    assert isinstance(caught.value, ModelLoadError)
    assert repr(model_type) in message and all(t in message for t in SUPPORTED) and "official" in message


def test_an_unsupported_feature_of_a_supported_type_is_refused(tmp_path):
    folder = make_tiny_model_dir(tmp_path, model_type="llama", config_extra={
        "rope_parameters": {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
                            "original_max_position_embeddings": 64}})
    engine = Engine(load_settings(model=str(folder), dtype="float32", device="cpu", quant="none"))
    with pytest.raises(UnsupportedArchitecture, match="rope_type 'yarn'"):
        engine.load()
