"""Resident memory of the loaded model per ``MINISERVE_QUANT`` setting, in a fresh process.

``python -m bench.quantization_memory --quant q8`` prints one JSON line: RSS after the
imports, what importing transformers' Qwen2 model adds (``model_imports_mb``, part of the
runtime a worker holds), what one more copy of the tokenizer adds (``tokenizer_mb``), after ``load_model`` (which quantizes and frees the bf16 copies), and after a
first 8-token ``custom_cache`` generation (forward built). ``worker_mb`` adds the paged KV
pool at its default size (``MINISERVE_KV_NUM_BLOCKS`` x ``MINISERVE_KV_BLOCK_SIZE``
tokens), which a worker allocates for its batches; ``full_weight_mb`` is the parameter
accounting of full-precision projection weights still held (0 when freed). Freed heap is handed back (``malloc_trim``) before each reading,
so transient load buffers do not count. The benchmark runs one such process per setting.
"""
from __future__ import annotations

import argparse
import ctypes
import json


def rss_mb() -> float:
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except OSError:
        pass
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def measure(quant: str, threads: int, model: str) -> dict:
    import torch  # (counted in the baseline, as in a worker)
    import transformers  # noqa: F401

    from core.settings import load_settings
    from engine.engine import Engine
    from engine.loader import load_model
    from engine.quant.model import forward_weights, quantized_bytes
    from engine.quant.restore import full_weight_bytes
    from engine.types import GenerationRequest, SamplingParams

    before = rss_mb()
    import transformers.models.qwen2.modeling_qwen2  # noqa: F401  (what load_model imports first)
    after_imports = rss_mb()
    settings = load_settings(model=model, quant=quant, threads=threads, device="cpu", dtype="bfloat16")
    loaded = load_model(settings)
    after_load = rss_mb()
    engine = Engine(settings, loaded)
    engine.generate(GenerationRequest(messages=[{"role": "user", "content": "Hi"}],
                                      sampling=SamplingParams(max_new_tokens=8), method="custom_cache"))
    after_gen = rss_mb()
    weights = forward_weights(loaded.model)
    embed_after_gen = _embed_resident_mb(weights)
    corpus = _corpus_ids(loaded.tokenizer)
    for start in range(0, len(corpus), 512):  # looked up as prefill chunks would
        ids = torch.tensor(corpus[start:start + 512])
        weights.embed[ids] if isinstance(weights.embed, torch.Tensor) else weights.embed.lookup(ids)
    after_corpus = rss_mb()
    cfg = weights.config
    pool = (settings.kv_num_blocks * settings.kv_block_size * cfg.num_layers * 2 * cfg.kv_size
            * torch.empty((), dtype=weights.dtype).element_size())
    return {"quant": quant, "loaded_as": loaded.quant, "rss_before_mb": round(before, 1),
            "model_imports_mb": round(after_imports - before, 1),
            "tokenizer_mb": round(_tokenizer_mb(loaded.tokenizer), 1),
            "rss_loaded_mb": round(after_load, 1), "rss_after_gen_mb": round(after_gen, 1),
            "model_rss_mb": round(after_gen - before, 1), "process_rss_mb": round(after_gen, 1),
            "kv_pool_mb": round(pool / 2**20, 1), "worker_mb": round(after_gen - before + pool / 2**20, 1),
            "quantized_mb": round(quantized_bytes(weights) / 2**20, 1),
            "embed_resident_mb": embed_after_gen, "corpus_tokens": len(corpus),
            "corpus_distinct_tokens": len(set(corpus)), "embed_resident_corpus_mb": _embed_resident_mb(weights),
            "worker_corpus_mb": round(after_corpus - before + pool / 2**20, 1),
            "full_weight_mb": round(full_weight_bytes(loaded.model) / 2**20, 1)}


def _embed_resident_mb(weights) -> float | None:
    """Resident MB of the embedding's file mapping (None: the table is in the heap)."""
    from engine.quant.mapped import resident_bytes

    table = getattr(weights.embed, "qweight", weights.embed)
    held = resident_bytes(table)
    return None if held is None else round(held / 2**20, 1)


def _corpus_ids(tokenizer) -> list[int]:
    """Token ids of the repo's own English and code text: README, docs and data prompts."""
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    files = [root / "README.md", *sorted((root / "docs").glob("*.md")), *sorted((root / "data").glob("*.json"))]
    return [i for path in files if path.is_file() for i in tokenizer.encode(path.read_text())]


def _tokenizer_mb(tokenizer) -> float:
    """What one more copy of the worker's tokenizer (loaded as load_model loads it) adds."""
    from engine.loader import drop_init_tables
    from transformers import AutoTokenizer

    before = rss_mb()
    copy = drop_init_tables(AutoTokenizer.from_pretrained(tokenizer.name_or_path))
    grown = rss_mb() - before
    del copy
    return grown


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quant", required=True, choices=["auto", "none", "q8"])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--model", default="default")
    parser.add_argument("--output", help="also write the reading, the command and the machine to this JSON file")
    args = parser.parse_args()
    reading = measure(args.quant, args.threads, args.model)
    print(json.dumps(reading), flush=True)
    if args.output:
        write_reading(args.output, reading, "bench.quantization_memory")


def write_reading(path: str, reading: dict, module: str) -> None:
    """A results file: the reading with the command that made it, when, and on what machine."""
    import sys
    import time

    from bench.stats import machine_summary
    from core.results import write_json

    write_json(path, {"command": f"python -m {module} " + " ".join(sys.argv[1:]),
                      "measured_at": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                      "machine": machine_summary(), "reading": reading})


if __name__ == "__main__":
    main()
