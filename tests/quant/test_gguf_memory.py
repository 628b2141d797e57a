"""A GGUF run on its own bits costs about its file in memory: no full-precision copy at load.

A fresh process (its peak, ``VmHWM``, is then the load's alone: ``ru_maxrss`` would not do, Linux
carries the parent's peak over ``fork`` + ``exec`` into it) prepares and loads a
GGUF with real row shapes (Qwen2.5-1.5B's hidden 1536 and intermediate 8960, three layers,
Q4_K with Q6_K ``ffn_down``/``attn_v``, ~80 MB) and then reads every weight byte once, as a
decode step does. Its peak resident growth over the imports must stay within 1.3x the file:
a float32 copy of these weights would be ~7x, a bf16 one ~3.5x. The load must not import a
transformers model class either (engine.gguf_model: about 120 MB for ``official`` alone).
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.tiny_gguf import make_tiny_gguf

ROOT = Path(__file__).resolve().parents[2]
SLACK_BYTES = 48 * 2**20  # the tokenizer, allocator arenas: not the weights

SCRIPT = r"""
import json, sys
import torch, transformers
from transformers import AutoConfig, AutoTokenizer, GenerationConfig
from core.settings import load_settings
from engine.loader import load_model
from engine.quant.model import forward_weights

def status(key):
    for line in open("/proc/self/status"):
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024

base = status("VmRSS")
loaded = load_model(load_settings(model=sys.argv[1], cache_dir=sys.argv[2], quant="gguf", device="cpu",
                                  dtype="bfloat16"))
weights = forward_weights(loaded.model)
parts = [p for layer in weights.layers for name in ("qkv", "o", "gate_up", "down")
         for p in getattr(layer, name).parts] + list(weights.lm_head.parts)
touched = sum(int(p.data.max()) >= 0 for p in parts)   # every page of every weight read once
print(json.dumps({"base": base, "peak": status("VmHWM"), "after": status("VmRSS"), "parts": touched,
                  "quant": loaded.quant, "modeling": "transformers.models.qwen2.modeling_qwen2" in sys.modules}))
"""


@pytest.fixture(scope="module")
def real_shaped(tmp_path_factory):
    types = {"*": "Q4_K", "ffn_down": "Q6_K", "attn_v": "Q6_K", "token_embd": "Q6_K", "output": "Q6_K"}
    return make_tiny_gguf(tmp_path_factory.mktemp("shaped") / "qwen2-1.5b-shape.gguf", types=types,
                          hidden_size=1536, intermediate_size=8960, num_heads=12, num_kv_heads=2, num_layers=3)


@pytest.mark.heavy
def test_loading_peaks_within_1_3x_the_file(real_shaped, tmp_path):
    result = subprocess.run([sys.executable, "-c", SCRIPT, str(real_shaped), str(tmp_path / "cache")],
                            cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    measured = json.loads(result.stdout.strip().splitlines()[-1])
    size = real_shaped.stat().st_size
    assert measured["quant"] == "gguf" and measured["parts"] == 3 * 7 + 1
    assert not measured["modeling"], "the load built transformers' model, which only official needs"
    assert size > 60 * 2**20
    growth = measured["peak"] - measured["base"]
    assert growth <= 1.3 * size + SLACK_BYTES, f"peak grew {growth / 2**20:.0f} MiB for a {size / 2**20:.0f} MiB file"
    assert measured["after"] - measured["base"] >= 0.8 * size   # the weights were read: the bound is not vacuous
