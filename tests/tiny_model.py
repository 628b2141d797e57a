"""Tiny random-weight Qwen2 models with a small self-made tokenizer, built offline in a second.

Used by every fast test that needs "a model": the engine's correctness tests, the worker and
web integration tests (``MINISERVE_MODEL=<folder>``). The tokenizer is a byte-level BPE
trained here on a little English + Chinese text, saved with Qwen2.5's chat template (tools
section included) and a ``generation_config.json`` carrying end-of-sequence ids and a
repetition penalty, so the same code paths run as with the real model.

``make_tiny_model_dir(path)`` writes the folder and returns it; same arguments, same bytes.
"""
from __future__ import annotations

import json
from pathlib import Path

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
FIM_TOKENS = ["<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>"]  # Qwen2.5-Coder's fill-in-the-middle

# Qwen2.5-Instruct's chat template (tokenizer_config.json of Qwen/Qwen2.5-0.5B-Instruct).
QWEN25_CHAT_TEMPLATE = (
    "{%- if tools %}\n    {{- '<|im_start|>system\\n' }}\n    {%- if messages[0]['role'] == 'system' %}\n"
    "        {{- messages[0]['content'] }}\n    {%- else %}\n"
    "        {{- 'You are Qwen, created by Alibaba Cloud. You are a helpful assistant.' }}\n"
    "    {%- endif %}\n"
    "    {{- \"\\n\\n# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\n"
    "You are provided with function signatures within <tools></tools> XML tags:\\n<tools>\" }}\n"
    "    {%- for tool in tools %}\n        {{- \"\\n\" }}\n        {{- tool | tojson }}\n    {%- endfor %}\n"
    "    {{- \"\\n</tools>\\n\\nFor each function call, return a json object with function name and "
    "arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{\\\"name\\\": <function-name>, "
    "\\\"arguments\\\": <args-json-object>}\\n</tool_call><|im_end|>\\n\" }}\n"
    "{%- else %}\n    {%- if messages[0]['role'] == 'system' %}\n"
    "        {{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}\n    {%- else %}\n"
    "        {{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. You are a helpful "
    "assistant.<|im_end|>\\n' }}\n    {%- endif %}\n{%- endif %}\n"
    "{%- for message in messages %}\n"
    "    {%- if (message.role == \"user\") or (message.role == \"system\" and not loop.first) or "
    "(message.role == \"assistant\" and not message.tool_calls) %}\n"
    "        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}\n"
    "    {%- elif message.role == \"assistant\" %}\n        {{- '<|im_start|>' + message.role }}\n"
    "        {%- if message.content %}\n            {{- '\\n' + message.content }}\n        {%- endif %}\n"
    "        {%- for tool_call in message.tool_calls %}\n"
    "            {%- if tool_call.function is defined %}\n                {%- set tool_call = tool_call.function %}\n"
    "            {%- endif %}\n            {{- '\\n<tool_call>\\n{\"name\": \"' }}\n"
    "            {{- tool_call.name }}\n            {{- '\", \"arguments\": ' }}\n"
    "            {{- tool_call.arguments | tojson }}\n            {{- '}\\n</tool_call>' }}\n"
    "        {%- endfor %}\n        {{- '<|im_end|>\\n' }}\n"
    "    {%- elif message.role == \"tool\" %}\n"
    "        {%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != \"tool\") %}\n"
    "            {{- '<|im_start|>user' }}\n        {%- endif %}\n"
    "        {{- '\\n<tool_response>\\n' }}\n        {{- message.content }}\n        {{- '\\n</tool_response>' }}\n"
    "        {%- if loop.last or (messages[loop.index0 + 1].role != \"tool\") %}\n"
    "            {{- '<|im_end|>\\n' }}\n        {%- endif %}\n    {%- endif %}\n{%- endfor %}\n"
    "{%- if add_generation_prompt %}\n    {{- '<|im_start|>assistant\\n' }}\n{%- endif %}\n"
)

_CORPUS = """
You are a helpful assistant. The user asks a question and the assistant answers it.
The quick brown fox jumps over the lazy dog. Hello, world! How are you today?
Please compute 12 * (3 + 4) and explain the steps. The answer is 84.
Write a short poem about the sea, the wind and the stars at night.
Large language models predict the next token from the previous tokens.
{"name": "calculator", "arguments": {"expression": "2 + 2"}}
def add(a, b):\n    return a + b\n
你好，世界！今天天气很好。我们一起去公园散步吧。
请用中文回答这个问题：大语言模型是什么？它可以写代码，也可以翻译。
北京是中国的首都。上海是一个很大的城市。学习使人进步。
Emoji test: 😀 🚀 ✨ — café, naïve, über.
"""


def _train_tokenizer(vocab_size: int, special_tokens: list[str] = SPECIAL_TOKENS):
    """A deterministic byte-level BPE over the small corpus above."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=list(special_tokens), show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), min_frequency=1)
    lines = [line for line in _CORPUS.strip().splitlines() if line] * 3
    tokenizer.train_from_iterator(lines, trainer=trainer)
    return tokenizer


def make_tiny_model_dir(path: str | Path, *, hidden_size: int = 64, num_layers: int = 2,
                        num_heads: int = 4, num_kv_heads: int = 2, head_dim: int | None = None,
                        intermediate_size: int | None = None, tie_word_embeddings: bool = False,
                        vocab_size: int = 400, rope_theta: float = 10000.0,
                        repetition_penalty: float = 1.1, seed: int = 0, model_type: str = "qwen2",
                        config_extra: dict | None = None, fim_tokens: bool = False) -> Path:
    """Write a tiny random model (Qwen2ForCausalLM unless ``model_type`` names another
    transformers architecture, e.g. llama, qwen3, mistral) + tokenizer + generation config
    into ``path``. ``config_extra`` overrides or adds config fields (rope_parameters, biases,
    sliding_window...). ``fim_tokens``: the tokenizer also has Qwen2.5-Coder's three
    fill-in-the-middle tokens (``/v1/completions`` with ``suffix``).

    ``vocab_size`` is the tokenizer's BPE target; the model's embedding has exactly as many
    rows as the tokenizer has tokens. ``head_dim`` may differ from hidden/heads (e.g. 24).
    """
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, GenerationConfig, PreTrainedTokenizerFast

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    specials = SPECIAL_TOKENS + (FIM_TOKENS if fim_tokens else [])
    raw = _train_tokenizer(vocab_size, specials)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=raw, eos_token="<|im_end|>", pad_token="<|endoftext|>",
        additional_special_tokens=list(specials), model_max_length=4096)
    tokenizer.chat_template = QWEN25_CHAT_TEMPLATE
    tokenizer.save_pretrained(path)
    eos_ids = [raw.token_to_id("<|im_end|>"), raw.token_to_id("<|endoftext|>")]

    fields = dict(
        vocab_size=raw.get_vocab_size(), hidden_size=hidden_size,
        intermediate_size=intermediate_size or hidden_size * 2 + 8,
        num_hidden_layers=num_layers, num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads, max_position_embeddings=4096,
        rope_parameters={"rope_type": "default", "rope_theta": rope_theta},
        tie_word_embeddings=tie_word_embeddings, rms_norm_eps=1e-6, head_dim=head_dim or hidden_size // num_heads,
        bos_token_id=eos_ids[1], eos_token_id=eos_ids[0], pad_token_id=eos_ids[1])
    config = AutoConfig.for_model(model_type, **{**fields, **(config_extra or {})})
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config).to(torch.float32).eval()
    with torch.no_grad():  # larger-than-default weights so logits are far from uniform
        for name, param in model.named_parameters():
            if "norm" in name:
                param.copy_(1.0 + 0.1 * torch.randn_like(param))
            else:
                param.normal_(0.0, 0.2 if "bias" in name else 0.08)
    model.save_pretrained(path, safe_serialization=True)
    GenerationConfig(
        bos_token_id=eos_ids[1], pad_token_id=eos_ids[1], eos_token_id=eos_ids,
        do_sample=True, repetition_penalty=repetition_penalty, temperature=0.7, top_p=0.8,
        top_k=20).save_pretrained(path)
    (path / "tiny_model.json").write_text(json.dumps({"seed": seed, "tied": tie_word_embeddings}))
    return path


try:  # pytest fixtures, for conftest files to re-export: `from tests.tiny_model import tiny_model_dir`
    import pytest

    @pytest.fixture(scope="session")
    def tiny_model_dir(tmp_path_factory: "pytest.TempPathFactory") -> Path:
        """One tiny model folder per test session (untied lm_head, GQA 4:2)."""
        return make_tiny_model_dir(tmp_path_factory.mktemp("tiny-qwen2"))
except ImportError:  # pragma: no cover - runtime installs have no pytest
    pass
