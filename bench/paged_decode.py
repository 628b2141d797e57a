"""Batch-1 decode through the paged scheduler (the service's default method) against ``custom_cache``: ``python -m bench.paged_decode``.

A job submitted with no ``generation_method`` runs ``paged``; ``bench.quantization`` times
batch-1 decode through ``custom_cache``. This loads one engine of the default setting, warms
it, and decodes the same prompts through ``paged`` with its K/V written and gathered in C
(``engine.fused.paged_gather``, where the attention stays torch's), through ``paged`` with
torch's indexing for both, and through ``custom_cache``, in interleaved rounds (order
alternating), reporting median decode tokens/s per variant, the ratios, and whether the
greedy tokens came out the same. Where the decode attention runs in C
(``engine.fused.attention_like_torch``) neither gather runs and the two paged variants time
the same code. Writes ``paged_decode.{json,png}``.
"""
from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path
from typing import Any
from unittest import mock

from bench.stats import cpu_model, finish_plot, machine_info, read_bandwidth_gbs, write_json
from core.settings import load_settings
from engine.engine import Engine
from engine.fused import attention_like_torch
from engine.paged import attention
from engine.quant.plan import resolve_quant
from engine.types import GenerationRequest, SamplingParams

PROMPTS = ["Write a long story about a dragon who learns to code in Python.",
           "用三段话介绍一下长城的历史。", "Explain how a hash map works, with an example in Python."]
VARIANTS = ("paged, gather in C", "paged, torch indexing", "custom_cache")


def _request(prompt: str, tokens: int, method: str) -> GenerationRequest:
    return GenerationRequest(messages=[{"role": "user", "content": prompt}], method=method,
                             sampling=SamplingParams(max_new_tokens=tokens, temperature=0.0, repetition_penalty=1.0))


def _torch_indexing() -> Any:
    """The paged path with its K/V written and gathered by torch's indexing ops."""
    keys_and_values = attention._keys_and_values
    return mock.patch.object(attention, "_keys_and_values",
                             lambda pool, layer, batch, q, k, v, gather_in_c: keys_and_values(
                                 pool, layer, batch, q, k, v, False))


def _generate(engine: Engine, variant: str, prompt: str, tokens: int) -> Any:
    method = "custom_cache" if variant == "custom_cache" else "paged"
    if variant == "paged, torch indexing":
        with _torch_indexing():
            return engine.generate(_request(prompt, tokens, method))
    return engine.generate(_request(prompt, tokens, method))


def measure(engine: Engine, rounds: int, tokens: int) -> dict[str, Any]:
    for variant in VARIANTS:
        _generate(engine, variant, PROMPTS[0], 16)               # warm every path
    rates: dict[str, list[float]] = {v: [] for v in VARIANTS}
    texts: dict[str, list[list[int]]] = {v: [] for v in VARIANTS}
    for r in range(rounds):
        for variant in (VARIANTS if r % 2 == 0 else tuple(reversed(VARIANTS))):
            for prompt in PROMPTS:
                result = _generate(engine, variant, prompt, tokens)
                rates[variant].append(result.timings.decode_tokens_per_s)
                if r == 0:
                    texts[variant].append(result.token_ids)
        print(f"round {r + 1}/{rounds}: " + ", ".join(f"{v} {statistics.median(rates[v]):.1f}" for v in VARIANTS),
              flush=True)
    p50 = {v: round(statistics.median(rates[v]), 2) for v in VARIANTS}
    reference = texts["custom_cache"]
    return {"tok_s_p50": p50,
            "gather_in_c_x": round(p50[VARIANTS[0]] / p50[VARIANTS[1]], 3),
            "paged_vs_custom_cache_x": round(p50[VARIANTS[0]] / p50["custom_cache"], 3),
            "identical_to_custom_cache": {v: f"{sum(a == b for a, b in zip(texts[v], reference))}/{len(PROMPTS)}"
                                          for v in VARIANTS[:2]},
            "samples": rates}


def plot(result: dict[str, Any], quant: str, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    ax.bar(list(VARIANTS), [result["tok_s_p50"][v] for v in VARIANTS], color=["tab:blue", "tab:gray", "tab:green"],
           label=f"{quant} decode tok/s, batch 1 (median)")
    ax.set_ylabel("tokens/s")
    ax.set_title(f"paged decode: gather in C {result['gather_in_c_x']}x, "
                 f"vs custom_cache {result['paged_vs_custom_cache_x']}x")
    finish_plot(fig, ax, path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--out", default="results")
    args = parser.parse_args(argv)
    settings = load_settings(device="cpu", dtype="bfloat16", threads=2)
    engine = Engine(settings).load()
    machine = {**machine_info(), "cpu_model": cpu_model(), "read_bandwidth_gbs": read_bandwidth_gbs(),
               "quant": settings.quant, "quant_resolves_to": resolve_quant(settings.quant, "cpu"),
               "decode_attention_in_c": attention_like_torch(),
               "command": "python -m bench.paged_decode " + " ".join(sys.argv[1:] if argv is None else argv)}
    result = measure(engine, args.rounds, args.tokens)
    out = Path(args.out)
    write_json(out / "paged_decode.json", {"machine": machine, "args": vars(args), **result})
    plot(result, machine["quant_resolves_to"], out / "paged_decode.png")
    print(f"{result['tok_s_p50']}; gather in C {result['gather_in_c_x']}x, paged / custom_cache "
          f"{result['paged_vs_custom_cache_x']}x; wrote {out}/paged_decode.json, .png")
    engine.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
