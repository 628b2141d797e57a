"""The model shapes ``python -m bench.models --sizes`` builds random-weight GGUF files of.

Decode speed depends on a model's shapes, not on its values, so each entry is the public
``config.json`` of a model people run on CPUs (hidden size, MLP width, layers, attention and
KV heads, vocabulary, RoPE, tied embeddings), and the benchmark fills it with random weights.
The vocabulary keeps its real size: the Qwen shapes take the default model's tokenizer (the
same 151,936-entry vocabulary); the Llama shapes take SmolLM2's tokenizer (49,152 tokens,
which llama.cpp's converter recognises), and the converter pads the table to the config's
128,256 entries with unused tokens, so the embedding and output matrices keep Llama 3's shape.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from hashlib import sha256
from typing import Any

LLAMA3_ROPE = {"rope_type": "llama3", "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 8192}


@dataclass(frozen=True)
class ModelShape:
    name: str
    family: str                 # "qwen2" or "llama": the architecture and the tokenizer it takes
    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    vocab: int
    rope_theta: float
    tied: bool                  # tie_word_embeddings: the output matrix is the embedding table
    max_positions: int
    rms_eps: float
    rope_scaling: dict[str, Any] | None = field(default=None, hash=False, compare=False)

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    def key(self) -> str:
        """A short digest of the shape: the cache file name changes when any field does."""
        return sha256(repr(sorted(asdict(self).items())).encode()).hexdigest()[:10]


SHAPES: dict[str, ModelShape] = {s.name: s for s in (
    ModelShape("qwen2.5-0.5b", "qwen2", 896, 4864, 24, 14, 2, 151936, 1e6, True, 32768, 1e-6),
    ModelShape("qwen2.5-1.5b", "qwen2", 1536, 8960, 28, 12, 2, 151936, 1e6, True, 32768, 1e-6),
    ModelShape("qwen2.5-3b", "qwen2", 2048, 11008, 36, 16, 2, 151936, 1e6, True, 32768, 1e-6),
    ModelShape("llama3.2-1b", "llama", 2048, 8192, 16, 32, 8, 128256, 5e5, True, 131072, 1e-5,
               {**LLAMA3_ROPE, "factor": 32.0}),
    ModelShape("llama3.2-3b", "llama", 3072, 8192, 28, 24, 8, 128256, 5e5, True, 131072, 1e-5,
               {**LLAMA3_ROPE, "factor": 32.0}),
    ModelShape("llama3.1-8b", "llama", 4096, 14336, 32, 32, 8, 128256, 5e5, False, 131072, 1e-5,
               {**LLAMA3_ROPE, "factor": 8.0}),
)}
DEFAULT_SIZES = ("qwen2.5-0.5b", "qwen2.5-1.5b", "qwen2.5-3b", "llama3.2-1b", "llama3.2-3b")
ON_REQUEST = ("llama3.1-8b",)  # --with-8b: a 4.9 GB file, built through 16 GB of BF16 on disk


def param_count(shape: ModelShape) -> int:
    """Parameters as transformers counts them (a tied output matrix once)."""
    kv = shape.kv_heads * shape.head_dim
    attention = shape.hidden * (shape.hidden + 2 * kv) + shape.hidden * shape.hidden
    if shape.family == "qwen2":
        attention += shape.hidden + 2 * kv  # Qwen2's q/k/v biases
    layer = attention + 3 * shape.hidden * shape.intermediate + 2 * shape.hidden
    embedding = shape.vocab * shape.hidden
    return shape.layers * layer + embedding * (1 if shape.tied else 2) + shape.hidden


def hf_config(shape: ModelShape) -> dict[str, Any]:
    """The config.json transformers builds the random model from."""
    config: dict[str, Any] = {
        "architectures": ["Qwen2ForCausalLM" if shape.family == "qwen2" else "LlamaForCausalLM"],
        "model_type": shape.family, "hidden_size": shape.hidden, "intermediate_size": shape.intermediate,
        "num_hidden_layers": shape.layers, "num_attention_heads": shape.heads,
        "num_key_value_heads": shape.kv_heads, "vocab_size": shape.vocab, "rope_theta": shape.rope_theta,
        "tie_word_embeddings": shape.tied, "max_position_embeddings": shape.max_positions,
        "rms_norm_eps": shape.rms_eps, "hidden_act": "silu", "initializer_range": 0.02,
        "torch_dtype": "bfloat16", "use_cache": True}
    if shape.family == "llama":
        config.update(head_dim=shape.head_dim, attention_bias=False, mlp_bias=False,
                      rope_scaling=dict(shape.rope_scaling or {}), bos_token_id=1, eos_token_id=2)
    else:
        config.update(sliding_window=shape.max_positions, use_sliding_window=False, max_window_layers=shape.layers,
                      bos_token_id=151643, eos_token_id=151645)
    return config


def resolve(names: list[str], with_8b: bool) -> list[ModelShape]:
    """The shapes a run asked for; an unknown name is an error naming the known ones."""
    wanted = list(names) + ([n for n in ON_REQUEST if n not in names] if with_8b else [])
    unknown = [n for n in wanted if n not in SHAPES]
    if unknown:
        raise SystemExit(f"unknown --size {', '.join(unknown)}: choose from {', '.join(SHAPES)}")
    return [SHAPES[n] for n in wanted]
