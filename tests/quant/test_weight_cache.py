"""A worker's second start reads the quantized weights its first start wrote
(engine.quant.weight_cache): the same tensors and tokens, without quantizing; a changed model
folder or an unreadable file is quantized afresh."""
from __future__ import annotations

import os

import pytest
import torch

from core.settings import load_settings
from engine.engine import Engine
from engine.quant import q8
from engine.quant.model import forward_weights
from engine.types import GenerationRequest, SamplingParams

REQUEST = GenerationRequest(messages=[{"role": "user", "content": "Count from one to ten."}],
                            sampling=SamplingParams(max_new_tokens=12), method="custom_cache")


@pytest.fixture
def quantize_calls(monkeypatch):
    calls = []
    quantize = q8.quantize
    monkeypatch.setattr(q8, "quantize", lambda w: (calls.append(w.shape), quantize(w))[1])
    return calls


def _start(model_dir, cache_dir):
    engine = Engine(load_settings(model=str(model_dir), device="cpu", dtype="float32", quant="q8",
                                  cache_dir=cache_dir)).load()
    tensors = [t for layer in forward_weights(engine.loaded.model).layers for p in ("qkv", "o", "gate_up", "down")
               for t in (getattr(layer, p).qweight, getattr(layer, p).params)]
    tokens = engine.generate(REQUEST).token_ids
    engine.close()
    return tensors, tokens


def _files(cache_dir):
    return sorted((cache_dir / "quantized").glob("*.safetensors"))


def test_a_second_start_reads_what_the_first_wrote(quant_model_dir, tmp_path, quantize_calls):
    first, first_tokens = _start(quant_model_dir, tmp_path)
    assert quantize_calls and len(_files(tmp_path)) == 1
    quantize_calls.clear()
    second, second_tokens = _start(quant_model_dir, tmp_path)
    assert quantize_calls == []  # nothing quantized: every tensor came from the file
    assert second_tokens == first_tokens
    assert all(torch.equal(a, b) for a, b in zip(first, second, strict=True))


def test_a_changed_folder_or_a_corrupt_file_is_quantized_afresh(quant_model_dir, tmp_path, quantize_calls):
    _, tokens = _start(quant_model_dir, tmp_path)
    [written] = _files(tmp_path)
    written.write_bytes(b"not a safetensors file")
    quantize_calls.clear()
    _, again = _start(quant_model_dir, tmp_path)
    assert quantize_calls and again == tokens and _files(tmp_path) == [written]  # rewritten in place
    assert written.stat().st_size > 1000

    config = quant_model_dir / "config.json"
    stat = config.stat()
    os.utime(config, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))  # the folder changed: a new key
    quantize_calls.clear()
    _start(quant_model_dir, tmp_path)
    assert quantize_calls and len(_files(tmp_path)) == 2
