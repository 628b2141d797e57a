"""What one more verified row costs a decode step: ``python -m bench.verify_rows``.

Speculative decoding verifies a sequence's pending token and its drafts in one forward; the
draft budget (engine/speculative/budget.py) prices each row beyond the first as a fraction
of a one-row step (``engine.speculative.config.row_cost``). This times the forward the
contiguous speculative loop runs (``custom_cache``, the default setting, a context of
``--context`` tokens) over 1, 2, 3, 5 and 9 rows, interleaved in rounds, and reports each
median and the cost per extra row, ``(t(n) / t(1) - 1) / (n - 1)``, beside the price the
engine uses on this CPU. Writes ``verify_rows.json``.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

from bench.stats import cpu_model, machine_info, read_bandwidth_gbs, write_json
from core.settings import load_settings
from engine.engine import Engine
from engine.handwritten import forward_for
from engine.kv_cache import ContiguousKVCache
from engine.quant import exact_attention
from engine.speculative.config import row_cost

ROWS = (1, 2, 3, 5, 9)


@torch.inference_mode()
def _timings(engine: Engine, context: int, rounds: int) -> dict[int, list[float]]:
    """Runs on the engine loop's thread (the forward's owner), as the engine runs a forward."""
    forward = forward_for(engine)
    weights = forward.weights
    cache = ContiguousKVCache(forward.config, context + max(ROWS), weights.dtype, weights.device,
                              exact=exact_attention(weights), fused=forward.fused_attention)
    generator = torch.Generator().manual_seed(0)
    prompt = torch.randint(0, forward.config.vocab_size, (context,), generator=generator)
    forward(prompt, cache)
    times: dict[int, list[float]] = {n: [] for n in ROWS}
    for r in range(rounds + 1):                                  # round 0 warms each shape
        for n in (ROWS if r % 2 == 0 else tuple(reversed(ROWS))):
            ids = torch.randint(0, forward.config.vocab_size, (n,), generator=generator)
            start = time.perf_counter()
            forward(ids, cache, last_only=n == 1)
            elapsed = time.perf_counter() - start
            cache.truncate(context)
            if r:
                times[n].append(elapsed * 1000.0)
    return times


def measure(engine: Engine, context: int, rounds: int) -> dict[str, Any]:
    times = engine.loop.call(lambda: _timings(engine, context, rounds))
    p50 = {n: statistics.median(times[n]) for n in ROWS}
    per_row = {n: round((p50[n] / p50[1] - 1.0) / (n - 1), 3) for n in ROWS if n > 1}
    price = engine.loop.call(lambda: row_cost(forward_for(engine).weights))
    return {"forward_ms_p50": {str(n): round(v, 2) for n, v in p50.items()},
            "cost_per_extra_row": {str(n): v for n, v in per_row.items()},
            "row_cost_used": price, "samples_ms": {str(n): times[n] for n in ROWS}}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--context", type=int, default=400)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--quant", default=None, help="MINISERVE_QUANT (default: the default setting)")
    parser.add_argument("--out", default="results")
    args = parser.parse_args(argv)
    overrides = {"quant": args.quant} if args.quant else {}
    engine = Engine(load_settings(device="cpu", dtype="bfloat16", threads=2, **overrides)).load()
    machine = {**machine_info(), "cpu_model": cpu_model(), "read_bandwidth_gbs": read_bandwidth_gbs(),
               "quant": engine.settings.quant,
               "command": "python -m bench.verify_rows " + " ".join(sys.argv[1:] if argv is None else argv)}
    result = measure(engine, args.context, args.rounds)
    out = Path(args.out)
    name = f"verify_rows_{args.quant}.json" if args.quant else "verify_rows.json"
    write_json(out / name, {"machine": machine, "args": vars(args), **result})
    print(f"forward ms p50 by rows {result['forward_ms_p50']}; cost per extra row {result['cost_per_extra_row']}; "
          f"the engine prices a row at {result['row_cost_used']}; wrote {out / name}")
    engine.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
