"""MINISERVE_QUANT=gguf: a quantized GGUF runs from its own blocks in the mapped file.

The reference is transformers' own GGUF loader: it dequantizes the same file with gguf-py
(and undoes llama.cpp's q/k row permutation of a Llama file itself), and our float32 forward
over those weights is what the native path must equal within float tolerance.
"""
from __future__ import annotations

import dataclasses
import os

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as T

from core.settings import load_settings
from engine import gguf_weights
from engine.engine import Engine
from engine.errors import InsufficientMemoryError
from engine.forward import Qwen2Forward
from engine.gguf_index import read_index
from engine.kv_cache import NoCache
from engine.loader import ModelLoadError, load_model
from engine.quant import gguf_native, interleaved_cache
from engine.quant.gguf_blocks import BlockWeight, dequantize_rows, uninterleave_x16
from engine.quant.gguf_linear import BlockEmbedding, BlockLinear
from engine.quant.model import forward_weights
from engine.quant.plan import PROJECTIONS
from engine.types import GenerationRequest, SamplingParams
from engine.weights import fuse_projections
from tests.tiny_gguf import make_tiny_gguf

IDS = torch.tensor([1, 5, 9, 20, 33, 7, 101, 64, 3, 12])
ATOL = 1e-5  # times the logits' scale: float32 sums in another order
# name -> (architecture, types, model args): Q8_0 (default), the gguf-py formats, the K formats
FILES = {
    "qwen2-q8_0": ("qwen2", None, {}),
    "llama-q4_0-q4_1-q5_0": ("llama", {"*": "Q4_0", "attn_v": "Q5_0", "ffn_down": "Q4_1", "token_embd": "Q8_0"},
                             {"tie_word_embeddings": True}),
    "qwen2-k": ("qwen2", {"*": "Q4_K", "attn_v": "Q6_K", "ffn_down": "Q6_K", "ffn_up": "Q5_K",
                          "token_embd": "Q6_K", "output": "Q6_K"}, {"hidden_size": 256, "intermediate_size": 512}),
    "llama-k": ("llama", {"*": "Q4_K", "attn_k": "Q6_K", "token_embd": "Q4_K", "output": "Q6_K"},
                {"hidden_size": 256, "intermediate_size": 512, "num_heads": 4, "num_kv_heads": 2}),
}


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("gguf-native")
    return {name: make_tiny_gguf(root / f"{name}.gguf", seed=i, architecture=arch, types=types, **args)
            for i, (name, (arch, types, args)) in enumerate(FILES.items())}


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("cache")


@pytest.fixture
def exact_matmul(monkeypatch):
    """The loader's arithmetic checked exactly: every block matmul by gguf-py's dequantization in
    float32 (the C kernels quantize activations to int8; tests/quant/test_gguf_kernels.py checks
    them against this reference, and the kernel path's agreement is checked below)."""
    from engine.quant import gguf_blocks, gguf_linear

    monkeypatch.setattr(gguf_linear, "block_matmul", gguf_blocks.reference_matmul)


def _settings(path, cache_dir, dtype="float32", quant="gguf"):
    return load_settings(model=str(path), cache_dir=str(cache_dir), dtype=dtype, device="cpu", quant=quant)


def _reference(path):
    """transformers' dequantized float32 model of the same file."""
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32).eval()


def _logits(weights, ids=IDS):
    return Qwen2Forward(weights)(ids, NoCache(), last_only=False).float()


@pytest.mark.parametrize("name", list(FILES))
def test_native_logits_equal_a_float32_forward_over_the_dequantized_file(files, cache_dir, name, exact_matmul):
    loaded = load_model(_settings(files[name], cache_dir))
    assert loaded.quant == "gguf"
    native = _logits(forward_weights(loaded.model))
    expected = _logits(fuse_projections(_reference(files[name])))
    scale = max(expected.abs().max().item(), 1.0)
    assert torch.allclose(native, expected, rtol=0, atol=ATOL * scale), (native - expected).abs().max()
    assert torch.equal(native.argmax(-1), expected.argmax(-1))


@pytest.mark.parametrize("name", list(FILES))
def test_the_c_kernel_path_agrees_with_the_float32_dequantized_forward(files, cache_dir, name):
    """With the C block kernels (int8 activations), the top-1 token at each position agrees with
    the float32 forward over the dequantized file above a floor: reported, not exact."""
    loaded = load_model(_settings(files[name], cache_dir))
    native = _logits(forward_weights(loaded.model))
    expected = _logits(fuse_projections(_reference(files[name])))
    agreement = (native.argmax(-1) == expected.argmax(-1)).float().mean().item()
    assert agreement >= 0.75, agreement


@pytest.mark.parametrize("name", ["llama-q4_0-q4_1-q5_0", "llama-k"])
def test_a_llama_file_gets_its_q_k_rows_put_back(files, cache_dir, monkeypatch, name):
    """The q/k rows equal transformers' un-permuted ones exactly, and would not without it."""
    path = files[name]
    reference = _reference(path).model.layers[1].self_attn
    expected = torch.cat([reference.q_proj.weight, reference.k_proj.weight, reference.v_proj.weight])
    assert torch.equal(forward_weights(load_model(_settings(path, cache_dir)).model).layers[1].qkv.dequantize(), expected)
    monkeypatch.setattr(gguf_weights, "PERMUTED_ARCHITECTURES", ())
    # a new placement is a new cache format: where this CPU interleaves the rows, the first load's
    # file (rows put back) would otherwise be mapped again
    monkeypatch.setattr(interleaved_cache, "FORMAT", interleaved_cache.FORMAT + 1)
    unpermuted = forward_weights(load_model(_settings(path, cache_dir)).model).layers[1].qkv.dequantize()
    assert not torch.equal(unpermuted, expected)
    assert torch.equal(unpermuted[-expected.shape[0] // 4:], expected[-expected.shape[0] // 4:])  # v: as stored


@pytest.mark.parametrize("name", ["qwen2-k", "llama-k"])
def test_bf16_greedy_agrees_with_the_float32_dequantized_path(files, cache_dir, name):
    """bf16 activations round differently: top-1 agreement over a teacher-forced text, against a floor."""
    loaded = load_model(_settings(files[name], cache_dir, dtype="bfloat16"))
    assert loaded.quant == "gguf" and loaded.dtype == torch.bfloat16
    ids = torch.arange(2, 66)
    native = _logits(forward_weights(loaded.model), ids).argmax(-1)
    expected = _logits(fuse_projections(_reference(files[name])), ids).argmax(-1)
    assert (native == expected).float().mean().item() >= 0.85


def test_no_full_precision_copy_of_a_projection_exists(files, cache_dir):
    path = files["qwen2-k"]
    loaded = load_model(_settings(path, cache_dir, dtype="bfloat16"))
    weights = forward_weights(loaded.model)
    mapped = _mapped_ranges(path)
    linears = [getattr(layer, p) for layer in weights.layers for p in PROJECTIONS] + [weights.lm_head]
    assert all(isinstance(linear, BlockLinear) for linear in linears)
    index = read_index(path)
    for part in [p for linear in linears for p in linear.parts] + [weights.embed.table]:
        assert isinstance(part, BlockWeight) and part.data.dtype == torch.uint8
        if part.interleaved:  # the same bytes in new places, never wider
            assert any(np.array_equal(uninterleave_x16(part.data.numpy(), part.ggml_type), index.data(name))
                       for name, info in index.tensors.items() if info.ggml_type == part.ggml_type
                       and tuple(info.shape) == (part.out_features, part.in_features))
            continue
        address = part.data.data_ptr()
        assert any(lo <= address < hi for lo, hi in mapped), "a Qwen2 file's blocks are views of its mapping"
    interleaved = {p.ggml_type for linear in linears for p in linear.parts if p.interleaved}
    assert interleaved == {T.Q4_K, T.Q6_K} & gguf_native.INTERLEAVED_BY_PATH[gguf_native.vector_path()]
    assert isinstance(weights.embed, BlockEmbedding)
    # The transformers model, built for official only, holds nothing but the norms (shared
    # with the forward's) and rotary tables.
    model = loaded.model.transformers_model()
    assert model is loaded.model.transformers_model() and forward_weights(model) is weights
    real = {name for name, p in model.named_parameters() if not p.is_meta}
    assert real and all("norm" in name for name in real)
    assert model.model.norm.weight.data_ptr() == weights.norm.data_ptr()
    assert model.generation_config is loaded.model.generation_config


def test_the_load_decides_each_interleaved_formats_prefill_path(files, cache_dir, monkeypatch):
    """The prefill probes run at load, once per interleaved format, not in a first prompt's prefill."""
    from engine.quant import gguf_blocks

    asked = []
    monkeypatch.setattr(gguf_blocks, "_fast_bf16_gemm", lambda: True)
    monkeypatch.setattr(gguf_blocks, "_x16_gemm_wins", lambda ggml_type: asked.append(ggml_type) or False)
    weights = forward_weights(load_model(_settings(files["qwen2-k"], cache_dir)).model)
    parts = [p for layer in weights.layers for name in PROJECTIONS for p in getattr(layer, name).parts]
    interleaved = {p.ggml_type for p in parts + list(weights.lm_head.parts) if p.interleaved}
    assert sorted(asked) == sorted(interleaved)
    assert interleaved == {T.Q4_K, T.Q6_K} & gguf_native.INTERLEAVED_BY_PATH[gguf_native.vector_path()]


def _mapped_ranges(path) -> list[tuple[int, int]]:
    """Address ranges of this process's mappings of ``path`` (/proc/self/maps)."""
    ranges = []
    with open("/proc/self/maps") as maps:
        for line in maps:
            fields = line.split(maxsplit=5)
            if len(fields) == 6 and fields[5].strip() == str(path.resolve()):
                lo, hi = (int(x, 16) for x in fields[0].split("-"))
                ranges.append((lo, hi))
    return ranges


def test_llama_q_k_are_heap_copies_of_the_same_bytes(files, cache_dir):
    path = files["llama-k"]
    weights = forward_weights(load_model(_settings(path, cache_dir)).model)
    index = read_index(path)
    qkv = weights.layers[0].qkv
    q, k, v = qkv.parts
    assert q.nbytes == index.tensors["blk.0.attn_q.weight"].nbytes and q.ggml_type.name == "Q4_K"
    assert k.ggml_type.name == "Q6_K"
    original = index.data("blk.0.attn_q.weight")
    rows = gguf_weights.head_permutation(q.out_features, 4)
    stored = uninterleave_x16(q.data.numpy(), q.ggml_type) if q.interleaved else q.data.numpy()
    assert np.array_equal(stored, original[rows]) and not np.array_equal(rows, np.arange(len(rows)))


def test_embedding_dequantizes_only_the_rows_asked_for(files, cache_dir):
    from gguf.quants import dequantize

    path = files["qwen2-k"]
    weights = forward_weights(load_model(_settings(path, cache_dir)).model)
    table = dequantize(read_index(path).data("token_embd.weight"), weights.embed.table.ggml_type)
    ids = torch.tensor([[3, 9], [9, 0]])
    rows = weights.embed_tokens(ids)
    assert rows.shape == (2, 2, 256) and torch.equal(rows, torch.from_numpy(table[ids.numpy()]))


def test_the_folder_holds_the_description_only(files, cache_dir, monkeypatch):
    from engine import prepare_gguf

    monkeypatch.setattr(prepare_gguf, "convert_gguf", lambda *a: pytest.fail("dequantized the file"))
    fresh = cache_dir / "fresh"
    load_model(_settings(files["qwen2-q8_0"], fresh))
    (folder,) = (fresh / "models").glob("gguf-*")  # beside it: the lock file
    names = {p.name for p in folder.iterdir()}
    assert {"config.json", "generation_config.json", "tokenizer_config.json", "tokenizer.json"} <= names
    assert not any(name.endswith((".safetensors", ".gguf")) for name in names)  # a user's file stays where it is


def test_gguf_is_refused_for_a_folder_model(tmp_path, quant_model_dir):
    with pytest.raises(ModelLoadError, match="MINISERVE_QUANT=gguf"):
        load_model(_settings(quant_model_dir, tmp_path))


def test_gguf_is_refused_for_an_unquantized_file(tmp_path):
    path = make_tiny_gguf(tmp_path / "f32.gguf", types={"*": "F32"})
    with pytest.raises(ModelLoadError, match="no matrix is block-quantized"):
        load_model(_settings(path, tmp_path / "cache"))


def test_methods_and_official_on_demand(files, cache_dir, exact_matmul):
    """The hand-written methods run the blocks; official dequantizes the file into the meta
    model for its job and frees it after: in float32 all agree on the tiny model."""
    engine = Engine(_settings(files["qwen2-q8_0"], cache_dir)).load()
    try:
        request = GenerationRequest(messages=[{"role": "user", "content": "hello world"}],
                                    sampling=SamplingParams(max_new_tokens=10, repetition_penalty=1.0))
        tokens = {m: engine.generate(dataclasses.replace(request, method=m)).token_ids
                  for m in ("paged", "custom_cache", "official")}
        model = engine.loaded.model.transformers_model()   # built by the official job (on the loader thread)
        assert len(tokens["paged"]) >= 4 and tokens["paged"] == tokens["custom_cache"] == tokens["official"]
        assert model.lm_head.weight.is_meta and model.model.layers[0].mlp.down_proj.weight.is_meta  # freed again
    finally:
        engine.close()


def test_official_refuses_when_memory_is_short(files, cache_dir, monkeypatch):
    from engine import gguf_model

    engine = Engine(_settings(files["qwen2-q8_0"], cache_dir)).load()
    try:
        monkeypatch.setattr(gguf_model, "available_bytes", lambda: 300 * 2**20)
        request = GenerationRequest(messages=[{"role": "user", "content": "hello"}], method="official",
                                    sampling=SamplingParams(max_new_tokens=4))
        with pytest.raises(InsufficientMemoryError, match=r"MiB.*available"):
            engine.generate(request)
        assert engine.loaded.model.transformers_model().lm_head.weight.is_meta
        monkeypatch.setattr(gguf_model, "available_bytes", lambda: 64 * 2**30)
        assert engine.generate(request).token_ids  # the next job, with memory, runs
    finally:
        engine.close()


def test_an_embedding_lookup_reads_the_reference_values_of_its_rows(files, cache_dir):
    """The embedding dequantizes only the rows asked for, in C; they equal gguf-py's values."""
    weights = forward_weights(load_model(_settings(files["qwen2-k"], cache_dir)).model)
    table = weights.embed.table
    assert isinstance(table, BlockWeight)
    ids = torch.tensor([[3, 0], [table.out_features - 1, 3]])
    got = weights.embed.rows(ids.reshape(-1))
    expected = torch.stack([dequantize_rows(table, i, i + 1)[0] for i in ids.reshape(-1).tolist()])
    assert torch.equal(got, expected)
    assert weights.embed.lookup(ids).shape == (2, 2, table.in_features)


def _interleaved_parts(cache_dir, path):
    """(the forward's weights, its interleaved parts in order) of a load with ``cache_dir``."""
    weights = forward_weights(load_model(_settings(path, cache_dir)).model)
    parts = [p for layer in weights.layers for name in PROJECTIONS for p in getattr(layer, name).parts]
    return weights, [p for p in parts + list(weights.lm_head.parts) if p.interleaved]


def _inside(part, ranges) -> bool:
    return any(lo <= part.data.data_ptr() < hi for lo, hi in ranges)


@pytest.mark.skipif(not gguf_native.INTERLEAVED_BY_PATH[gguf_native.vector_path()] & {T.Q4_K, T.Q6_K},
                    reason="this CPU's vector path interleaves none of the file's formats")
def test_a_second_load_maps_the_interleaved_cache_the_first_wrote(files, tmp_path, monkeypatch):
    """engine.quant.interleaved_cache: the first load writes the moved bytes to a file and maps
    it; the second maps it and moves nothing; both equal a load that interleaves in memory."""
    path = files["qwen2-k"]
    first, written = _interleaved_parts(tmp_path, path)
    (toc,) = (tmp_path / "interleaved").glob("*.json")
    in_file = _mapped_ranges(toc.with_suffix(".bin"))
    assert written and all(_inside(p, in_file) for p in written)

    monkeypatch.setattr(gguf_native, "repack_x16", lambda *a, **k: pytest.fail("interleaved again"))
    second, read = _interleaved_parts(tmp_path, path)
    monkeypatch.undo()
    in_file = _mapped_ranges(toc.with_suffix(".bin"))
    assert [p.ggml_type for p in read] == [p.ggml_type for p in written] and all(_inside(p, in_file) for p in read)

    (tmp_path / "memory").mkdir()
    (tmp_path / "memory" / "interleaved").write_text("a file where the cache folder would be")
    in_memory, moved = _interleaved_parts(tmp_path / "memory", path)   # no cache: as before
    assert not any(_inside(p, in_file) for p in moved)
    assert all(torch.equal(a.data, b.data) and torch.equal(a.data, c.data) for a, b, c in zip(written, read, moved))
    assert torch.equal(_logits(first), _logits(second)) and torch.equal(_logits(first), _logits(in_memory))


@pytest.mark.skipif(not gguf_native.INTERLEAVED_BY_PATH[gguf_native.vector_path()] & {T.Q4_K, T.Q6_K},
                    reason="this CPU's vector path interleaves none of the file's formats")
def test_a_changed_file_gets_a_new_interleaved_cache_and_the_old_one_goes(files, tmp_path):
    path = tmp_path / "copy.gguf"
    path.write_bytes(files["qwen2-k"].read_bytes())
    _interleaved_parts(tmp_path, path)
    (old,) = (tmp_path / "interleaved").glob("*.json")
    os.utime(path, ns=(path.stat().st_atime_ns, path.stat().st_mtime_ns + 10**9))
    _interleaved_parts(tmp_path, path)
    (new,) = (tmp_path / "interleaved").glob("*.json")
    assert new != old and not old.with_suffix(".bin").exists() and new.with_suffix(".bin").exists()
