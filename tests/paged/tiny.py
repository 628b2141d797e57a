"""A tiny random-weight Qwen2ForCausalLM built in memory (no tokenizer) for forward tests."""
from __future__ import annotations

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM


def tiny_qwen2(seed: int = 0, dtype: torch.dtype = torch.float32, tie: bool = False,
               layers: int = 2, vocab: int = 128) -> Qwen2ForCausalLM:
    torch.manual_seed(seed)
    config = Qwen2Config(vocab_size=vocab, hidden_size=64, intermediate_size=128,
                         num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=512, tie_word_embeddings=tie,
                         attn_implementation="sdpa")
    model = Qwen2ForCausalLM(config).to(dtype).eval()
    # Random init leaves biases at zero; give q/k/v biases values so they are exercised.
    with torch.no_grad():
        for layer in model.model.layers:
            for proj in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj):
                proj.bias.normal_(0, 0.5)
    return model
