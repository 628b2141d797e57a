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
from pathlib import Path
from typing import Any

from bench.stats import cpu_model, machine_info, read_bandwidth_gbs, write_json
from core.settings import load_settings
from engine.engine import Engine
from engine.handwritten import forward_for
from engine.speculative.config import row_cost
from engine.speculative.row_price import verify_step_times

ROWS = (1, 2, 3, 5, 9)


def _timings(engine: Engine, context: int, rounds: int) -> dict[int, list[float]]:
    """Milliseconds per verify forward by row count; runs on the engine loop's thread (the
    forward's owner), as the engine runs a forward (the same timing as the measured row price)."""
    times = verify_step_times(forward_for(engine), context, ROWS, rounds)
    return {n: [t * 1000.0 for t in ts] for n, ts in times.items()}


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
