"""oneDNN-prepacked bf16 projections (engine.packed): ``F.linear``'s numbers within bf16's
rounding, the plain copies freed, greedy tokens agreeing with ``official``.

The prepacked (blocked) weight runs another oneDNN kernel than ``F.linear``'s plain one: bit for
bit on the CPUs measured, which is not promised on others, so the tests hold a floor."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from core.settings import load_settings
from engine.engine import Engine
from engine.packed import PackedLinear, packing_available
from engine.quant.model import bytes_per_token, forward_weights
from engine.quant.restore import full_weight_bytes, full_weights
from engine.types import GenerationRequest, SamplingParams
from engine.weights import Linear, fuse_projections
from tests.agreement import common_prefix, equal_fraction

pytestmark = pytest.mark.skipif(not packing_available(torch.bfloat16, torch.device("cpu")),
                                reason="this CPU's oneDNN has no bf16 kernels")


@pytest.mark.parametrize("rows", [1, 3, 8, 37])
@pytest.mark.parametrize("with_bias", [False, True])
def test_packed_linear_matches_f_linear(rows, with_bias):
    gen = torch.Generator().manual_seed(rows)
    weight = torch.randn(96, 64, generator=gen).to(torch.bfloat16)
    bias = torch.randn(96, generator=gen).to(torch.bfloat16) if with_bias else None
    x = torch.randn(rows, 64, generator=gen).to(torch.bfloat16)
    packed = PackedLinear.from_linear(Linear(weight, bias))
    strided = torch.randn(rows, 128, generator=gen).to(torch.bfloat16)[:, ::2]  # a non-contiguous input
    for inputs in (x, strided):
        got, want = packed(inputs), F.linear(inputs, weight, bias)
        # float32 sums of 64 products, rounded to bf16: another order moves a result a step
        torch.testing.assert_close(got, want, rtol=1.6e-2, atol=1e-3)
        assert equal_fraction(got, want) > 0.9


def _greedy(engine: Engine, method: str) -> list[int]:
    request = GenerationRequest(messages=[{"role": "user", "content": "Write a short poem about the sea."}],
                                sampling=SamplingParams(max_new_tokens=10), method=method)
    return engine.generate(request).token_ids


def test_bf16_none_packs_frees_and_stays_greedy_in_agreement(tiny_model_dir):
    engine = Engine(load_settings(model=str(tiny_model_dir), dtype="bfloat16", device="cpu", quant="none",
                                  official_keep_weights=True))
    model = engine.loaded.model
    weights = forward_weights(model)
    assert isinstance(weights.layers[0].qkv, PackedLinear) and isinstance(weights.lm_head, PackedLinear)
    assert full_weight_bytes(model) == 0  # the plain copies are gone until official needs them
    got = {method: _greedy(engine, method) for method in ("custom_cache", "paged", "prefix_cache")}
    reference = _greedy(engine, "official")  # reloads the plain weights first (and keeps them: asked to)
    assert full_weight_bytes(model) > 0
    head = model.lm_head.weight  # reloaded as from_pretrained leaves it (else generate runs 3-5x slower)
    assert head.requires_grad and not head.is_inference()
    # identical on the CPUs measured; a random tiny model's near-tie may flip on another one,
    # a wrongly packed weight gives another token from the first step
    assert all(common_prefix(tokens, reference) >= 5 for tokens in got.values()), (got, reference)
    assert bytes_per_token(weights) == bytes_per_token(fuse_projections(model))


def test_official_frees_the_plain_weights_it_reloaded(tiny_model_dir):
    engine = Engine(load_settings(model=str(tiny_model_dir), dtype="bfloat16", device="cpu", quant="none"))
    model = engine.loaded.model
    first = _greedy(engine, "official")
    assert full_weight_bytes(model) == 0  # reloaded for the job, freed after it
    assert _greedy(engine, "official") == first and full_weight_bytes(model) == 0


def test_overlapping_official_runs_free_after_the_last(tiny_model_dir):
    """Solo tasks interleave: the weights one official run reloaded stay until no run needs them."""
    engine = Engine(load_settings(model=str(tiny_model_dir), dtype="bfloat16", device="cpu", quant="none"))
    model = engine.loaded.model
    with full_weights(model):
        with full_weights(model):
            assert full_weight_bytes(model) > 0
        assert full_weight_bytes(model) > 0
    assert full_weight_bytes(model) == 0


def test_float32_is_not_packed(tiny_engine):
    assert isinstance(forward_weights(tiny_engine.loaded.model).layers[0].qkv, Linear)


def test_bf16_without_packing_says_so(tiny_model_dir, monkeypatch, caplog):
    """A CPU whose oneDNN lacks bf16 kernels runs the plain path: /workers and the log say so."""
    monkeypatch.setattr("engine.quant.model.packing_available", lambda *_: False)
    monkeypatch.setattr("engine.packed.packing_available", lambda *_: False)
    with caplog.at_level("WARNING", logger="miniserve"):
        engine = Engine(load_settings(model=str(tiny_model_dir), dtype="bfloat16", device="cpu", quant="none"))
        engine.loaded  # noqa: B018 - loads the model
    assert "not prepacked" in engine.info()["quant"]
    assert any("weights_not_packed" in record.getMessage() for record in caplog.records)
    assert not isinstance(forward_weights(engine.loaded.model).layers[0].qkv, PackedLinear)
