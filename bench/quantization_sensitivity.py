"""Which tensors matter: teacher-forced fidelity when one projection class is quantized.

``python -m bench.quantization_sensitivity`` loads the default model once (bf16), makes the
bf16 greedy continuation of each benchmark prompt, then for every (projection class, format)
replaces only that class by its quantize->dequantize image (the values the packed kernel
multiplies) and scores, over all continuation positions in one teacher-forced pass: top-1
agreement with bf16 and mean KL(bf16 || quantized). Cheap (one prefill per prompt and
plan), so it can rank classes and plans before the full benchmark.
Writes ``results/quant_sensitivity.csv``.
"""
from __future__ import annotations

import argparse
import dataclasses
import time
from pathlib import Path

import torch

from bench.stats import print_table, write_csv
from core.settings import load_settings
from engine.forward import Qwen2Forward
from engine.kv_cache import ContiguousKVCache
from engine.loader import load_model
from engine.quant.plan import PROJECTIONS, QuantPlan, dequantized_image
from engine.weights import Linear, fuse_projections


def reference_run(forward: Qwen2Forward, prompts: list[list[int]], tokens: int) -> list[list[int]]:
    out = []
    with torch.inference_mode():
        for ids in prompts:
            cache = ContiguousKVCache(forward.config, len(ids) + tokens + 1, forward.weights.dtype, forward.weights.device)
            logits = forward(torch.tensor(ids), cache)
            got = []
            for _ in range(tokens):
                token = int(logits[-1].argmax())
                got.append(token)
                logits = forward(torch.tensor([token]), cache)
            out.append(got)
    return out


def score(forward: Qwen2Forward, base: Qwen2Forward, prompts: list[list[int]],
          refs: list[list[int]]) -> dict[str, float]:
    """Teacher-forced top-1 agreement and mean KL over the continuation positions."""
    same = total = 0
    kl = 0.0
    with torch.inference_mode():
        for ids, ref in zip(prompts, refs):
            full = torch.tensor(ids + ref[:-1])
            logs = []
            for fw in (base, forward):
                cache = ContiguousKVCache(fw.config, len(full) + 1, fw.weights.dtype, fw.weights.device)
                logs.append(fw(full, cache, last_only=False)[len(ids) - 1:].float().log_softmax(-1))
            p, q = logs
            same += int((q.argmax(-1) == torch.tensor(ref)).sum())
            total += len(ref)
            kl += float((p.exp() * (p - q)).sum(-1).sum())
    return {"agree_tf": same / total, "kl_mean": kl / total}


def main(argv: list[str] | None = None) -> int:
    from bench.quantization import PROMPTS

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--formats", default="int4,int4-hqq,int4-awq,int8")
    parser.add_argument("--prompts", type=int, default=8, help="how many benchmark prompts (zh+en alternate)")
    parser.add_argument("--classes", default=",".join(PROJECTIONS + ("lm_head",)))
    parser.add_argument("--out", default="results/quant_sensitivity.csv")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    loaded = load_model(load_settings(dtype="bfloat16", device="cpu", quant="none"))
    weights = fuse_projections(loaded.model)
    base = Qwen2Forward(weights)
    from engine.engine import Engine
    from engine.types import GenerationRequest
    engine = Engine(load_settings(), loaded)
    chosen = [PROMPTS[(i % 2) * 4 + i // 2] for i in range(args.prompts)]  # en, zh, en, zh, ...
    prompts = [engine.prompt(GenerationRequest(messages=[{"role": "user", "content": p}])).ids for p in chosen]
    refs = reference_run(base, prompts, args.tokens)
    importance = None
    if "int4-awq" in args.formats:
        from engine.quant.calibration import input_importance

        importance = input_importance(weights, loaded.tokenizer)
    print("reference ready", flush=True)
    rows = []
    for fmt in args.formats.split(","):
        for cls in args.classes.split(","):
            started = time.perf_counter()
            image = dequantized_image(weights, cls, fmt, importance)
            quant = _replace(weights, cls, image)
            row = {"tensor": cls, "format": fmt, **score(Qwen2Forward(quant), base, prompts, refs),
                   "seconds": round(time.perf_counter() - started, 1)}
            print("ROW", row, flush=True)
            rows.append(row)
            write_csv(Path(args.out), rows)  # after every row: a long run keeps what it measured
            del image, quant
    print_table(rows, ["tensor", "format", "agree_tf", "kl_mean", "seconds"])
    write_csv(Path(args.out), rows)
    return 0


def _replace(weights, cls: str, image):
    if cls == "lm_head":
        return dataclasses.replace(weights, lm_head=Linear(image[0], weights.lm_head.bias))
    layers = [dataclasses.replace(layer, **{cls: Linear(w, getattr(layer, cls).bias)})
              for layer, w in zip(weights.layers, image)]
    return dataclasses.replace(weights, layers=layers)


if __name__ == "__main__":
    raise SystemExit(main())
