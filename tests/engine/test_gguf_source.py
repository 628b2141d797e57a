"""MINISERVE_MODEL=<file>.gguf: prepared once under its sha256, metadata honoured, bad files refused."""
from __future__ import annotations

import dataclasses
import json
import shutil

import numpy as np
import pytest

from core.file_digest import file_sha256
from core.model_source import local_model_dir, served_model_name
from core.settings import load_settings
from engine import prepare_gguf
from engine.engine import Engine
from engine.gguf_meta import GGUFFileError, GGUFMeta
from engine.loader import ModelLoadError, resolve_model_path
from engine.types import GenerationRequest, SamplingParams
from tests.tiny_gguf import make_tiny_gguf
from tests.tiny_model import QWEN25_CHAT_TEMPLATE

USER = [{"role": "user", "content": "你好 world, compute 12 * 3 please"}]


@pytest.fixture(scope="module")
def gguf_file(tmp_path_factory):
    return make_tiny_gguf(tmp_path_factory.mktemp("gguf") / "tiny-chat.gguf")


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("cache")


def _settings(model, cache_dir, **extra):
    return load_settings(model=str(model), cache_dir=str(cache_dir), dtype="float32", device="cpu", quant="none",
                         **extra)


def test_a_gguf_file_is_prepared_once_under_its_sha256(gguf_file, cache_dir, monkeypatch):
    settings = _settings(gguf_file, cache_dir)
    name, source = resolve_model_path(settings)
    folder = cache_dir / "models" / f"gguf-{file_sha256(gguf_file)}"
    assert (name, source) == ("tiny-chat", str(folder)) and served_model_name(settings) == "tiny-chat"
    assert local_model_dir(settings) == folder  # where the web finds the tokenizer
    generation = json.loads((folder / "generation_config.json").read_text())
    tokenizer_config = json.loads((folder / "tokenizer_config.json").read_text())
    # From the GGUF metadata: eos <|im_end|> (id 2), bos and pad <|endoftext|> (id 0), the template.
    assert (generation["eos_token_id"], generation["pad_token_id"], generation["bos_token_id"]) == ([2], 0, 0)
    assert tokenizer_config["eos_token"] == "<|im_end|>" and tokenizer_config["pad_token"] == "<|endoftext|>"
    chat_template = tokenizer_config.get("chat_template") or (folder / "chat_template.jinja").read_text()
    assert chat_template == QWEN25_CHAT_TEMPLATE
    # Prepared once: neither a second start nor a renamed copy converts again.
    monkeypatch.setattr(prepare_gguf, "convert_gguf", lambda *a: pytest.fail("converted twice"))
    copy = shutil.copy(gguf_file, gguf_file.parent / "renamed.gguf")
    assert resolve_model_path(_settings(copy, cache_dir))[1] == str(folder)


def test_methods_on_a_gguf_match_transformers_generate_on_the_file(gguf_file, cache_dir):
    import torch
    from transformers import AutoModelForCausalLM

    engine = Engine(_settings(gguf_file, cache_dir)).load()
    try:
        reference = AutoModelForCausalLM.from_pretrained(gguf_file.parent, gguf_file=gguf_file.name,
                                                         dtype=torch.float32).eval()
        request = GenerationRequest(messages=USER, sampling=SamplingParams(max_new_tokens=12, repetition_penalty=1.0))
        ids = engine.prompt(request).ids
        out = reference.generate(torch.tensor([ids]), max_new_tokens=12, do_sample=False, repetition_penalty=1.0,
                                 eos_token_id=engine.loaded.eos_ids, pad_token_id=0)[0, len(ids):].tolist()
        expected = [t for t in out if t not in engine.loaded.eos_ids]
        assert len(expected) >= 4
        for method in ("official", "custom_cache", "paged"):
            assert engine.generate(dataclasses.replace(request, method=method)).token_ids == expected, method
    finally:
        engine.close()


def test_generation_defaults_come_from_metadata_with_overrides_on_top(tmp_path):
    meta = GGUFMeta(path=tmp_path / "m.gguf", architecture="llama", tensor_types={"F32": 1},
                    bos_token_id=1, eos_token_ids=(2, 7), sampling={"temperature": 0.6, "top_k": 40.0})
    values = prepare_gguf.generation_defaults(meta, {"top_k": 20})
    assert values == {"bos_token_id": 1, "eos_token_id": [2, 7], "pad_token_id": 2, "temperature": 0.6,
                      "top_k": 20, "do_sample": True}


def _expect_refused(path, cache_dir, match):
    with pytest.raises(ModelLoadError, match=match) as caught:
        resolve_model_path(_settings(path, cache_dir))
    assert str(path) in str(caught.value)
    assert not (cache_dir / "models" / f"gguf-{file_sha256(path)}").exists() if path.exists() else True


def test_truncated_garbage_and_missing_files_are_clear_errors(gguf_file, tmp_path):
    data = gguf_file.read_bytes()
    for cut in (len(data) // 2, 200):
        truncated = tmp_path / f"cut-{cut}.gguf"
        truncated.write_bytes(data[:cut])
        _expect_refused(truncated, tmp_path / "cache", "corrupt or truncated")
    garbage = tmp_path / "garbage.gguf"
    garbage.write_bytes(np.random.default_rng(0).bytes(4096))
    _expect_refused(garbage, tmp_path / "cache", "corrupt or truncated")
    _expect_refused(tmp_path / "absent.gguf", tmp_path / "cache", "does not exist")


def test_a_tensor_type_transformers_cannot_read_is_refused(tmp_path):
    import gguf

    path = tmp_path / "q8_1.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    # Q8_1 (32 values in 40 bytes) is a llama.cpp-internal type that gguf.quants cannot dequantize.
    writer.add_tensor("token_embd.weight", np.zeros((4, 40), dtype=np.uint8), raw_dtype=gguf.GGMLQuantizationType.Q8_1)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(GGUFFileError, match=r"type Q8_1, which transformers cannot dequantize"):
        resolve_model_path(_settings(path, tmp_path / "cache"))
