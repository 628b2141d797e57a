"""One-token decode attention: transformers' call, the folded one, and our fused C call: ``python -m bench.decode_attention``.

A contiguous cache (``custom_cache``, ``prefix_cache``) rounds attention as transformers does
(SDPA with ``enable_gqa``) when the weights are full precision, so ``none`` keeps ``official``'s
greedy tokens; with low-bit weights a one-token step runs :func:`engine.fused.attend_decode`
(one C call that writes the token's k/v and attends, rounding as SDPA's CPU kernel does), and
before that folded each kv head's query group into the query axis
(``engine.kv_cache.grouped_attention(exact=False)``). This measures the three calls per layer
at several context lengths (the model's shapes: 14 query heads, 2 kv heads, 64 dims, bf16;
median of 200), and batch-1 decode through the engine loop under ``q8`` with a long prompt in
three modes: ``exact`` (transformers' call, torch's small ops), ``folded`` (torch's ops) and
``fused`` (engine.fused: every small op in C), interleaved rounds, medians. Writes
``results/decode_attention.{json,csv,png}``.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable
from unittest import mock

import torch

from bench.stats import cpu_model, finish_plot, machine_info, read_bandwidth_gbs, write_csv, write_json
from core.settings import load_settings
from engine.engine import Engine
from engine.fused import attend_decode
from engine.handwritten import forward_for
from engine.kv_cache import grouped_attention
from engine.types import GenerationRequest, SamplingParams

NOTE = ("A note on caching. " + "Each layer keeps the keys and values of every earlier token, so a decode step "
        "attends over the whole context instead of recomputing it. ") * 40


def per_call_us(fn: Callable[[], Any], repeats: int = 200) -> float:
    for _ in range(20):
        fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e6


def layer_rows(contexts: list[int]) -> list[dict[str, Any]]:
    rows = []
    for context in contexts:
        q = torch.randn(1, 14, 64).bfloat16()
        keys, values = torch.randn(2, context, 64).bfloat16(), torch.randn(2, context, 64).bfloat16()
        exact = per_call_us(lambda: grouped_attention(q, keys, values, context - 1))
        folded = per_call_us(lambda: grouped_attention(q, keys, values, context - 1, exact=False))
        k_new, v_new = keys[None, :, -1], values[None, :, -1]
        fused = per_call_us(lambda: attend_decode(q, k_new, v_new, keys, values, context - 1))
        rows.append({"context": context, "exact_us": round(exact, 1), "folded_us": round(folded, 1),
                     "fused_us": round(fused, 1), "x": round(exact / folded, 2), "x_fused": round(exact / fused, 2)})
        print(f"context {context}: exact {exact:.0f} us, folded {folded:.0f} us, fused (C, with the k/v write) "
              f"{fused:.0f} us per layer", flush=True)
    return rows


MODES = {"exact": (True, False), "folded": (False, False), "fused": (False, True)}  # (exact, fused)


def decode_rate(engine: Engine, tokens: int, mode: str) -> tuple[float, int]:
    """``exact``: transformers' attention call and torch's small ops; ``folded``: the folded
    SDPA call, torch's ops; ``fused``: every small op and the attention in C (engine.fused)."""
    exact, fused = MODES[mode]
    request = GenerationRequest(messages=[{"role": "user", "content": NOTE + "\nSummarize the note."}],
                                method="custom_cache", sampling=SamplingParams(max_new_tokens=tokens))
    engine.loop.call(lambda: setattr(forward_for(engine), "fused", fused))  # on the loop thread, its owner
    with mock.patch("engine.handwritten.exact_attention", lambda weights: exact):
        result = engine.generate(request)
    return result.timings.decode_tokens_per_s, result.usage.prompt_tokens


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--contexts", default="100,300,1000,2000")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=48)
    parser.add_argument("--out", default="results")
    args = parser.parse_args(argv)
    bandwidth = read_bandwidth_gbs()
    layers = layer_rows([int(c) for c in args.contexts.split(",")])
    engine = Engine(load_settings(quant="q8")).load()
    decode_rate(engine, 8, "fused")                                      # warm up: builds the forward
    rates: dict[str, list[float]] = {mode: [] for mode in MODES}
    prompt_tokens = 0
    for round_ in range(args.rounds):
        for mode in (list(MODES) if round_ % 2 == 0 else list(reversed(MODES))):
            rate, prompt_tokens = decode_rate(engine, args.tokens, mode)
            rates[mode].append(rate)
            print(f"round {round_} {mode}: {rate:.1f} tok/s", flush=True)
    engine.close()
    medians = {mode: statistics.median(values) for mode, values in rates.items()}
    decode = {"quant": "q8", "prompt_tokens": prompt_tokens, "new_tokens": args.tokens,
              **{f"{mode}_tok_s": round(rate, 2) for mode, rate in medians.items()},
              "x": round(medians["folded"] / medians["exact"], 3),
              "x_fused": round(medians["fused"] / medians["exact"], 3), "rounds": args.rounds}
    print(f"q8 decode, {prompt_tokens}-token prompt: " + ", ".join(f"{m} {r:.1f} tok/s" for m, r in medians.items()))
    out = Path(args.out)
    machine = {**machine_info(), "cpu_model": cpu_model(), "read_bandwidth_gbs": bandwidth,
               "command": "python -m bench.decode_attention " + " ".join(sys.argv[1:] if argv is None else argv)}
    write_json(out / "decode_attention.json", {"machine": machine, "layers": layers, "decode": decode})
    write_csv(out / "decode_attention.csv", layers)
    plot(layers, out / "decode_attention.png")
    print(f"wrote {out}/decode_attention.json, .csv, .png")
    return 0


def plot(layers: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5))
    contexts = [row["context"] for row in layers]
    ax.plot(contexts, [row["exact_us"] for row in layers], marker="o", label="SDPA enable_gqa (transformers' call)")
    ax.plot(contexts, [row["folded_us"] for row in layers], marker="o", label="query group folded")
    ax.plot(contexts, [row["fused_us"] for row in layers], marker="o", label="fused C call (k/v write included)")
    ax.set_xlabel("context tokens")
    ax.set_ylabel("us per layer, one decode token")
    finish_plot(fig, ax, path)


if __name__ == "__main__":
    raise SystemExit(main())
