"""The one-call decode step over a GGUF file's own blocks (native/step.c with gguf.c's team
kernels) against the per-operation forward it replaces: the same C pieces in the same order,
so the same logits and cache bit for bit, for every block format and mixed-format fused parts."""
from __future__ import annotations

import pytest
import torch

from core.settings import load_settings
from engine.forward import Qwen2Forward
from engine.loader import load_model
from engine.ops.fused_ops import CAttentionOps
from engine.quant.gguf_linear import BlockLinear
from engine.quant.model import forward_weights
from tests.quant.test_step import _decode_batch, assert_one_call_equals_per_operation
from tests.tiny_gguf import make_tiny_gguf

# name -> (architecture, types, model args): every format the kernels run, mixed within a layer
FILES = {
    "qwen2-q8_0": ("qwen2", None, {"intermediate_size": 128}),    # the tiny model's 136: not whole blocks
    "llama-32-input": ("llama", {"*": "Q4_0", "attn_v": "Q5_0", "ffn_down": "Q4_1", "token_embd": "Q8_0"},
                       {"tie_word_embeddings": True, "intermediate_size": 128}),
    "qwen2-k": ("qwen2", {"*": "Q4_K", "attn_v": "Q6_K", "ffn_down": "Q6_K", "ffn_up": "Q5_K",
                          "token_embd": "Q6_K", "output": "Q6_K"}, {"hidden_size": 256, "intermediate_size": 512}),
    "qwen2-k-and-32": ("qwen2", {"*": "Q4_K", "attn_v": "Q8_0", "ffn_gate": "Q5_0", "output": "Q6_K"},
                       {"hidden_size": 256, "intermediate_size": 512}),
}


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("gguf-step")
    return {name: make_tiny_gguf(root / f"{name}.gguf", seed=i, architecture=arch, types=types, **args)
            for i, (name, (arch, types, args)) in enumerate(FILES.items())}


def _gguf_weights(path, cache_dir):
    loaded = load_model(load_settings(model=str(path), cache_dir=str(cache_dir), dtype="bfloat16", device="cpu",
                                      quant="gguf"))
    weights = forward_weights(loaded.model)
    assert isinstance(weights.layers[0].qkv, BlockLinear)
    return weights


def _gguf_forward(path, cache_dir) -> Qwen2Forward:
    return Qwen2Forward(_gguf_weights(path, cache_dir), ops=CAttentionOps())


def test_a_gguf_forward_attends_in_c_and_takes_the_one_call_step_where_q8_would_not(files, tmp_path, monkeypatch):
    """On a CPU where q8 keeps torch's attention (AVX2), a GGUF file's own blocks still attend in
    C, so their decode steps take the one-call kernel."""
    from engine.ops import choose

    monkeypatch.setattr(choose, "attention_like_torch", lambda: False)
    forward = Qwen2Forward(_gguf_weights(files["qwen2-k"], tmp_path))
    assert isinstance(forward.ops, CAttentionOps) and forward.decode_step is not None


@pytest.mark.parametrize("name", list(FILES))
@pytest.mark.parametrize("threads", [1, 2])
def test_one_call_gguf_step_equals_the_per_operation_forward_bit_for_bit(files, tmp_path, name, threads):
    assert_one_call_equals_per_operation(_gguf_forward(files[name], tmp_path), threads)


def test_a_file_with_a_full_precision_matrix_keeps_the_per_operation_forward(tmp_path):
    """The tiny model's ffn_down takes 136 inputs, not whole blocks: the file keeps it in F32."""
    path = make_tiny_gguf(tmp_path / "f32-down.gguf")
    forward = _gguf_forward(path, tmp_path)
    assert forward.decode_step is None


@pytest.mark.parametrize("name", ["qwen2-k", "qwen2-k-and-32"])
def test_a_paged_decode_batch_over_gguf_blocks_equals_the_per_operation_path(files, tmp_path, name):
    from engine.paged.forward import PagedQwen2

    forward = _gguf_forward(files[name], tmp_path)
    model = PagedQwen2(forward)
    want, want_pool = _decode_batch(model, forward, False, 5)
    got, got_pool = _decode_batch(model, forward, True, 5)
    assert torch.equal(got, want)
    assert torch.equal(got_pool.k, want_pool.k) and torch.equal(got_pool.v, want_pool.v)
