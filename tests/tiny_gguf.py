"""A tiny random-weight Qwen2 model written as a GGUF file by the ``gguf`` package, in a second.

It stands in for "a user's .gguf" in the fast tests: the tiny model of :mod:`tests.tiny_model`
(same weights, tokenizer and chat template) put through ``gguf.GGUFWriter`` with llama.cpp's
tensor names and tokenizer keys, its projections whose rows are a multiple of 32 stored as Q8_0 (so the dequantizing path runs)
and norms as F32. transformers reads it back with ``gguf_file=``.
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


def make_tiny_gguf(path: str | Path, seed: int = 0) -> Path:
    """Write ``path`` (a .gguf file) and return it."""
    import gguf
    import numpy as np
    from safetensors.numpy import load_file

    path = Path(path)
    folder = make_tiny_model_dir(path.parent / f".{path.stem}-src", seed=seed)
    config = json.loads((folder / "config.json").read_text())
    vocab = json.loads((folder / "tokenizer.json").read_text())["model"]
    tokens = sorted(vocab["vocab"], key=vocab["vocab"].get)
    added = {t["content"] for t in json.loads((folder / "tokenizer.json").read_text())["added_tokens"]}
    writer = gguf.GGUFWriter(str(path), "qwen2")
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
    for name, array in sorted(load_file(folder / "model.safetensors").items()):
        array = array.astype(np.float32)
        if array.ndim == 2 and "embed" not in name and array.shape[1] % 32 == 0:
            writer.add_tensor(_gguf_name(name), gguf.quants.quantize(array, gguf.GGMLQuantizationType.Q8_0),
                              raw_dtype=gguf.GGMLQuantizationType.Q8_0)
        else:
            writer.add_tensor(_gguf_name(name), array)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def _write_header(writer, config: dict) -> None:
    writer.add_context_length(config["max_position_embeddings"])
    writer.add_embedding_length(config["hidden_size"])
    writer.add_block_count(config["num_hidden_layers"])
    writer.add_feed_forward_length(config["intermediate_size"])
    writer.add_head_count(config["num_attention_heads"])
    writer.add_head_count_kv(config["num_key_value_heads"])
    writer.add_rope_freq_base(config.get("rope_theta") or config["rope_parameters"]["rope_theta"])
    writer.add_layer_norm_rms_eps(config["rms_norm_eps"])
