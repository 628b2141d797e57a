"""A tiny random-weight Qwen2 (or Llama) model written as a GGUF file by the ``gguf`` package, in a second.

It stands in for "a user's .gguf" in the fast tests: the tiny model of :mod:`tests.tiny_model`
(same weights, tokenizer and chat template) put through ``gguf.GGUFWriter`` with llama.cpp's
tensor names and tokenizer keys, its matrices whose rows are a multiple of 32 stored as Q8_0
by default (so the dequantizing path runs) and norms as F32. transformers reads it back with
``gguf_file=``.

``types`` chooses each matrix's format by its GGUF name stem (``attn_q``, ``ffn_down``,
``token_embd``, ``output``...; key ``"*"`` for the rest): Q8_0, Q4_0, Q4_1, Q5_0 are
gguf-py's own quantization of the model's weights; gguf-py cannot quantize the K formats, so
Q4_K, Q5_K and Q6_K matrices are random *valid* blocks (random codes and bounded scales: the
values differ from the model's, which the tests compare against gguf-py's dequantization of
the same file, not against the model). A Llama file gets llama.cpp's rotary permutation of the
q/k rows, as its converter writes them.
"""
from __future__ import annotations

import json
from pathlib import Path

from tests.tiny_model import QWEN25_CHAT_TEMPLATE, make_tiny_model_dir

# transformers name (after "model.layers.N.") -> GGUF name (after "blk.N.").
_LAYER_NAMES = {
    "input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm",
    "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
}


def _gguf_name(name: str) -> str:
    if name == "model.embed_tokens.weight":
        return "token_embd.weight"
    if name == "model.norm.weight":
        return "output_norm.weight"
    if name == "lm_head.weight":
        return "output.weight"
    _, _, index, rest = name.split(".", 3)
    stem, kind = rest.rsplit(".", 1)
    return f"blk.{index}.{_LAYER_NAMES[stem]}.{kind}"


def make_tiny_gguf(path: str | Path, seed: int = 0, *, architecture: str = "qwen2",
                   types: dict[str, str] | None = None, **model_args) -> Path:
    """Write ``path`` (a .gguf file) and return it. ``architecture``: qwen2 or llama;
    ``types``: see the module's docstring; ``model_args``: :func:`make_tiny_model_dir`'s."""
    import gguf
    import numpy as np
    from safetensors.numpy import load_file

    path = Path(path)
    folder = make_tiny_model_dir(path.parent / f".{path.stem}-src", seed=seed, model_type=architecture, **model_args)
    config = json.loads((folder / "config.json").read_text())
    vocab = json.loads((folder / "tokenizer.json").read_text())["model"]
    tokens = sorted(vocab["vocab"], key=vocab["vocab"].get)
    added = {t["content"] for t in json.loads((folder / "tokenizer.json").read_text())["added_tokens"]}
    writer = gguf.GGUFWriter(str(path), architecture)
    _write_header(writer, config)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("qwen2")
    writer.add_token_list(tokens)
    writer.add_token_types([gguf.TokenType.CONTROL if t in added else gguf.TokenType.NORMAL for t in tokens])
    writer.add_token_merges([" ".join(m) if isinstance(m, list) else m for m in vocab["merges"]])
    writer.add_eos_token_id(vocab["vocab"]["<|im_end|>"])
    writer.add_bos_token_id(vocab["vocab"]["<|endoftext|>"])
    writer.add_pad_token_id(vocab["vocab"]["<|endoftext|>"])
    writer.add_chat_template(QWEN25_CHAT_TEMPLATE)
    rng = np.random.default_rng(seed)
    for name, array in sorted(load_file(folder / "model.safetensors").items()):
        array = array.astype(np.float32)
        gguf_name = _gguf_name(name)
        if architecture == "llama" and (".attn_q." in gguf_name or ".attn_k." in gguf_name):
            heads = config["num_attention_heads"] if ".attn_q." in gguf_name else config["num_key_value_heads"]
            array = _llama_permute(array, heads)
        kind = _type_of(gguf_name, array, types)
        if kind is None:
            writer.add_tensor(gguf_name, array)
        else:
            writer.add_tensor(gguf_name, _encode(array, kind, rng), raw_dtype=kind)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def _type_of(gguf_name: str, array, types: dict[str, str] | None):
    """The block format of one tensor, or None for float32 (vectors, rows not in whole blocks)."""
    import gguf

    if array.ndim != 2:
        return None
    stem = gguf_name.split(".")[-2] if gguf_name.startswith("blk.") else gguf_name.split(".")[0]
    if types is None:
        name = None if stem == "token_embd" else "Q8_0"
    else:
        name = types.get(stem, types.get("*"))
    if name is None or name == "F32":
        return None
    kind = gguf.GGMLQuantizationType[name]
    if array.shape[1] % gguf.GGML_QUANT_SIZES[kind][0]:
        return None
    return kind


def _llama_permute(array, n_head: int):
    """llama.cpp's converter's ``LlamaModel.permute`` of q/k rows (weights and biases)."""
    return (array.reshape(n_head, 2, array.shape[0] // n_head // 2, *array.shape[1:])
            .swapaxes(1, 2).reshape(array.shape))


# byte offsets of the fp16 scale fields in one block of each K format (d, and dmin where it has one)
_K_SCALES = {"Q4_K": (0, 2), "Q5_K": (0, 2), "Q6_K": (208,)}
_K_D = {"Q4_K": 3e-4, "Q5_K": 1.5e-4, "Q6_K": 2e-4}


def _encode(array, kind, rng):
    """``array`` in block format ``kind``: gguf-py's quantization, or random valid K blocks."""
    import gguf
    import numpy as np

    if kind.name not in _K_SCALES:
        return gguf.quants.quantize(array, kind)
    block_elems, block_bytes = gguf.GGML_QUANT_SIZES[kind]
    rows, blocks = array.shape[0], array.shape[1] // block_elems
    raw = rng.integers(0, 256, size=(rows, blocks, block_bytes), dtype=np.uint8)
    if kind.name == "Q6_K":   # int8 sub-block scales: kept small
        raw[..., 192:208] = rng.integers(-16, 17, size=(rows, blocks, 16)).astype(np.int8).view(np.uint8)
    for offset in _K_SCALES[kind.name]:
        d = rng.uniform(0.5, 1.5, size=(rows, blocks)).astype(np.float16) * np.float16(_K_D[kind.name])
        raw[..., offset:offset + 2] = d[..., None].view(np.uint8).reshape(rows, blocks, 2)
    return raw.reshape(rows, blocks * block_bytes)


def _write_header(writer, config: dict) -> None:
    writer.add_context_length(config["max_position_embeddings"])
    writer.add_embedding_length(config["hidden_size"])
    writer.add_block_count(config["num_hidden_layers"])
    writer.add_feed_forward_length(config["intermediate_size"])
    writer.add_head_count(config["num_attention_heads"])
    writer.add_head_count_kv(config["num_key_value_heads"])
    writer.add_rope_freq_base(config.get("rope_theta") or config["rope_parameters"]["rope_theta"])
    writer.add_layer_norm_rms_eps(config["rms_norm_eps"])
