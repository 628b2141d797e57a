"""The low-bit decode step with its small operations fused in C, against torch's: ``python -m bench.fused_ops``.

``engine.fused`` runs a low-bit forward's RMSNorms, q/k rotary, silu(gate) * up and a decode
token's cache write + attention as one C call each. This loads one ``q8`` engine, warms it,
and decodes the same prompts through ``custom_cache`` with the forward's ``fused`` switch on
and off, in interleaved rounds (order alternating), reporting median decode tokens/s per
switch, their ratio, and how many greedy texts came out the same. It also times one decode
step's work outside the linears: the same generation with every q8 linear replaced by an
empty result of the right shape (what is left is norms, rotary, attention, the residual
stream, sampling and Python). Writes ``results/fused_ops.{json,png}``.

``--agreement``: instead, the free-running greedy agreement with bf16 (``none``) on
bench.quantization's prompts and metric, for torch's small ops, every one in C but the
attention, and every one in C: whether the C attention rounds like torch's kernels on this
CPU (engine.fused.attention_like_torch). Writes ``fused_agreement.json``.
"""
from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path
from typing import Any
from unittest import mock

import torch

from bench.stats import cpu_model, finish_plot, machine_info, read_bandwidth_gbs, write_json
from core.settings import load_settings
from engine.engine import Engine
from engine.handwritten import forward_for
from engine.types import GenerationRequest, SamplingParams

PROMPTS = ["Write a Python function that reverses a string.", "用一句话介绍一下长城。",
           "Explain what a hash map is in two sentences.", "写一个计算斐波那契数列的函数。"]


def _request(prompt: str, tokens: int) -> GenerationRequest:
    return GenerationRequest(messages=[{"role": "user", "content": prompt}], method="custom_cache",
                             sampling=SamplingParams(max_new_tokens=tokens, temperature=0.0, repetition_penalty=1.0))


def _empty_linear(x2d: torch.Tensor, codes: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
    return torch.zeros(x2d.shape[0], codes.shape[0], dtype=x2d.dtype)


def _switch(engine: Engine, fused: bool) -> None:
    """Turn the forward's fused operations on or off, on the engine loop's thread (its owner)."""
    engine.loop.call(lambda: setattr(forward_for(engine), "fused", fused))


def measure(engine: Engine, rounds: int, tokens: int) -> dict[str, Any]:
    engine.generate(_request(PROMPTS[0], 16))                 # warm: builds the forward
    rates: dict[bool, list[float]] = {True: [], False: []}
    outside: dict[bool, list[float]] = {True: [], False: []}
    texts: dict[bool, list[list[int]]] = {True: [], False: []}
    for r in range(rounds):
        for fused in ((True, False) if r % 2 == 0 else (False, True)):
            _switch(engine, fused)
            for prompt in PROMPTS:
                result = engine.generate(_request(prompt, tokens))
                rates[fused].append(result.timings.decode_tokens_per_s)
                if r == 0:
                    texts[fused].append(result.token_ids)
            with mock.patch("engine.quant.q8.linear", _empty_linear):
                result = engine.generate(_request(PROMPTS[0], tokens))
            outside[fused].append(1000.0 / result.timings.decode_tokens_per_s)
        print(f"round {r + 1}/{rounds}: fused {statistics.median(rates[True]):.1f} tok/s, "
              f"torch ops {statistics.median(rates[False]):.1f}", flush=True)
    _switch(engine, True)
    on, off = statistics.median(rates[True]), statistics.median(rates[False])
    return {"fused_tok_s": round(on, 2), "torch_ops_tok_s": round(off, 2), "x": round(on / off, 3),
            "outside_linears_ms": {"fused": round(statistics.median(outside[True]), 2),
                                   "torch_ops": round(statistics.median(outside[False]), 2)},
            "identical_texts": f"{sum(a == b for a, b in zip(texts[True], texts[False]))}/{len(PROMPTS)}",
            "samples": {"fused": rates[True], "torch_ops": rates[False]}}


AGREEMENT_VARIANTS = (("torch ops", False, False), ("all in C but the attention", True, False), ("all in C", True, True))


def agreement(engine: Engine, reference: Engine, tokens: int) -> dict[str, Any]:
    """Free-running agreement with ``reference`` per variant (fused, C attention)."""
    from bench.quantization import PROMPTS as QUALITY_PROMPTS
    from bench.quantization_quality import free_running

    def texts(eng: Engine) -> list[list[int]]:
        return [eng.generate(_request(prompt, tokens)).token_ids for prompt in QUALITY_PROMPTS]

    want = texts(reference)
    forward = engine.loop.call(lambda: forward_for(engine))
    default = (forward.fused, forward.c_attention)
    out = {}
    for name, fused, attention in AGREEMENT_VARIANTS:
        engine.loop.call(lambda: (setattr(forward, "fused", fused), setattr(forward, "c_attention", attention)))
        out[name] = free_running(want, texts(engine))
        print(f"{name}: {out[name]}", flush=True)
    engine.loop.call(lambda: (setattr(forward, "fused", default[0]), setattr(forward, "c_attention", default[1])))
    return {"this_cpu_default": {"fused": default[0], "c_attention": default[1]}, "agreement": out}


def plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    labels = ["torch ops", "fused (C)"]
    ax.bar(labels, [result["torch_ops_tok_s"], result["fused_tok_s"]], color=["tab:gray", "tab:blue"],
           label="q8 decode tok/s, batch 1 (median)")
    ax.set_ylabel("tokens/s")
    ax.set_title(f"q8 decode, small ops fused: {result['x']}x")
    finish_plot(fig, ax, path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--out", default="results")
    parser.add_argument("--agreement", action="store_true", help="agreement with bf16 per variant, not speed")
    args = parser.parse_args(argv)
    engine = Engine(load_settings(quant="q8", device="cpu", dtype="bfloat16", threads=2)).load()
    machine = {**machine_info(), "cpu_model": cpu_model(), "read_bandwidth_gbs": read_bandwidth_gbs(),
               "command": "python -m bench.fused_ops " + " ".join(sys.argv[1:] if argv is None else argv)}
    out = Path(args.out)
    if args.agreement:
        reference = Engine(load_settings(quant="none", device="cpu", dtype="bfloat16", threads=2)).load()
        result = agreement(engine, reference, tokens=32)
        write_json(out / "fused_agreement.json", {"machine": machine, "args": vars(args), **result})
        print(f"wrote {out}/fused_agreement.json")
        reference.close()
        engine.close()
        return 0
    result = measure(engine, args.rounds, args.tokens)
    write_json(out / "fused_ops.json", {"machine": machine, "args": vars(args), **result})
    plot(result, out / "fused_ops.png")
    print(f"fused {result['fused_tok_s']} tok/s vs torch ops {result['torch_ops_tok_s']}: {result['x']}x; "
          f"outside the linears {result['outside_linears_ms']} ms per step; "
          f"identical texts {result['identical_texts']}; wrote {out}/fused_ops.json, .png")
    engine.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
