"""A q8 decode step in one C call against the per-operation forward: ``python -m bench.decode_step``.

``engine.quant.step`` runs a one-token step of a q8 model (every layer, the final norm, the
head) as one C call and one parallel region, where the fused forward makes ~170 calls into C
from Python, each linear forking the thread team anew. Both compute the same numbers. This
loads one ``q8`` engine, warms it, and decodes the same prompts through ``custom_cache`` with
the forward's ``one_call_step`` switch on and off, in interleaved rounds (order alternating):
median decode tokens/s per switch, their ratio, each as a share of the step's bandwidth floor
(weight bytes read per token / the machine's read bandwidth, measured in the same run), and
how many greedy texts came out the same (all of them, unless a kernel is broken). Writes
``results/decode_step.{json,png}``.
"""
from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path
from typing import Any

from bench.fused_ops import PROMPTS, _request
from bench.stats import cpu_model, finish_plot, machine_info, read_bandwidth_gbs, write_json
from core.settings import load_settings
from engine.engine import Engine
from engine.handwritten import forward_for
from engine.quant import bytes_per_token

VARIANTS = {True: "one call", False: "per operation"}


def _switch(engine: Engine, one_call: bool) -> None:
    """Turn the one-call step on or off, on the engine loop's thread (the forward's owner)."""
    engine.loop.call(lambda: setattr(forward_for(engine), "one_call_step", one_call))


def measure(engine: Engine, rounds: int, tokens: int) -> dict[str, Any]:
    engine.generate(_request(PROMPTS[0], 16))                 # warm: builds the forward and the step
    forward = engine.loop.call(lambda: forward_for(engine))
    if engine.loop.call(lambda: forward.decode_step) is None:
        raise SystemExit("this CPU's q8 forward does not take the one-call step (no C attention here)")
    rates: dict[bool, list[float]] = {True: [], False: []}
    texts: dict[bool, list[list[int]]] = {True: [], False: []}
    for r in range(rounds):
        for one_call in ((True, False) if r % 2 == 0 else (False, True)):
            _switch(engine, one_call)
            for prompt in PROMPTS:
                result = engine.generate(_request(prompt, tokens))
                rates[one_call].append(result.timings.decode_tokens_per_s)
                if r == 0:
                    texts[one_call].append(result.token_ids)
        print(f"round {r + 1}/{rounds}: one call {statistics.median(rates[True]):.1f} tok/s, "
              f"per operation {statistics.median(rates[False]):.1f}", flush=True)
    _switch(engine, True)
    on, off = statistics.median(rates[True]), statistics.median(rates[False])
    return {"one_call_tok_s": round(on, 2), "per_operation_tok_s": round(off, 2), "x": round(on / off, 3),
            "identical_texts": f"{sum(a == b for a, b in zip(texts[True], texts[False]))}/{len(PROMPTS)}",
            "bytes_per_token": bytes_per_token(forward.weights),
            "samples": {"one_call": rates[True], "per_operation": rates[False]}}


def add_floor(result: dict[str, Any], bandwidth_gbs: float) -> None:
    """Each variant's share of the bandwidth floor (the step reading its weights once)."""
    floor_ms = result["bytes_per_token"] / (bandwidth_gbs * 1e9) * 1e3
    result["floor_ms"] = round(floor_ms, 2)
    for key in ("one_call", "per_operation"):
        result[f"{key}_pct_of_floor"] = round(100 * floor_ms * result[f"{key}_tok_s"] / 1e3, 1)


def plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    ax.bar(["per operation", "one call"], [result["per_operation_tok_s"], result["one_call_tok_s"]],
           color=["tab:gray", "tab:blue"], label="q8 decode tok/s, batch 1 (median)")
    ax.set_ylabel("tokens/s")
    ax.set_title(f"q8 decode step in one C call: {result['x']}x")
    finish_plot(fig, ax, path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--out", default="results")
    args = parser.parse_args(argv)
    engine = Engine(load_settings(quant="q8", device="cpu", dtype="bfloat16", threads=2)).load()
    bandwidth = read_bandwidth_gbs()   # releases its OpenMP team before the timings (bench.stats)
    machine = {**machine_info(), "cpu_model": cpu_model(), "read_bandwidth_gbs": bandwidth,
               "command": "python -m bench.decode_step " + " ".join(sys.argv[1:] if argv is None else argv)}
    result = measure(engine, args.rounds, args.tokens)
    add_floor(result, bandwidth)
    out = Path(args.out)
    write_json(out / "decode_step.json", {"machine": machine, "args": vars(args), **result})
    plot(result, out / "decode_step.png")
    print(f"one call {result['one_call_tok_s']} tok/s ({result['one_call_pct_of_floor']}% of the floor) vs per "
          f"operation {result['per_operation_tok_s']} ({result['per_operation_pct_of_floor']}%): {result['x']}x; "
          f"identical texts {result['identical_texts']}; wrote {out}/decode_step.json, .png")
    engine.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
