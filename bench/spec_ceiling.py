"""``python -m bench.spec_ceiling``: the most speculation could give bench.speculative's serving loop here.

Why: in a batch of 8 a CPU step is compute-bound, so an accepted draft costs about what the
decode row it replaces costs; speculation can only win back the part of a step that does not
grow with its rows (reading the weights once). This measures the scheduler's batched step on
this machine (decode-only and verify-shaped: ``b`` sequences of ``r`` rows each at a
``--context``-token context, one-byte activations where the scheduler uses them) and replays
bench.speculative's closed loop (8 slots fed from its queue of jobs, their kinds and completion
token counts taken from a results CSV's spec-off serving round) twice: speculation off, and on
with **every** draft accepted (k per step, for each k) on the copy-heavy jobs while the
nothing-to-copy jobs draft nothing. Prefill is left out: it costs the same on and off, so
leaving it out can only raise the ceiling. The ratio is an upper bound for any drafter.

Writes ``<out>/spec_ceiling_<quant>.json`` and ``.png``.
"""
from __future__ import annotations

import argparse
import csv
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

from bench.paged_common import machine, pyplot
from bench.stats import cpu_model, read_bandwidth_gbs, write_json
from core.settings import load_settings
from engine.engine import Engine
from engine.handwritten import forward_for
from engine.paged.attention import SeqChunk, build_batch
from engine.paged.forward import PagedQwen2

SLOTS = 8
SHAPES = [(b, 1) for b in range(1, SLOTS + 1)] + [(SLOTS, r) for r in range(2, 10)]


def step_costs(engine: Engine, context: int, rounds: int) -> dict[tuple[int, int], float]:
    """Median seconds of one batched step of ``b`` sequences x ``r`` rows, for each of :data:`SHAPES`."""
    forward = forward_for(engine)
    paged = PagedQwen2(forward)
    block = engine.settings.kv_block_size
    per_seq = -(-(context + 16) // block)
    pool = paged.make_pool(SLOTS * per_seq, block)
    tables = [list(range(s * per_seq, (s + 1) * per_seq)) for s in range(SLOTS)]
    generator = torch.Generator().manual_seed(0)
    vocab = forward.config.vocab_size
    for table in tables:                                        # each sequence's context, once
        paged.forward(torch.randint(0, vocab, (context,), generator=generator),
                      build_batch([SeqChunk(table, 0, context)], block), pool)
    times: dict[tuple[int, int], list[float]] = {shape: [] for shape in SHAPES}
    for round_ in range(rounds + 1):                            # round 0 warms every shape
        for b, r in (SHAPES if round_ % 2 == 0 else SHAPES[::-1]):
            batch = build_batch([SeqChunk(tables[s], context, r) for s in range(b)], block)
            ids = torch.randint(0, vocab, (b * r,), generator=generator)
            rows = torch.arange(b * r) if r > 1 else None
            start = time.perf_counter()
            paged.forward(ids, batch, pool, rows=rows, decode_only=True)   # the slots are rewritten next time
            if round_:
                times[(b, r)].append(time.perf_counter() - start)
    return {shape: statistics.median(t) for shape, t in times.items()}


def cost_of(costs: dict[tuple[int, int], float], rows: int) -> float:
    """A step's seconds by its row count: measured decode steps up to 8 rows, then linear between
    the measured 8-sequence verify shapes (and beyond the last, on the last two's slope)."""
    if rows <= SLOTS:
        return costs[(rows, 1)]
    points = sorted((SLOTS * r, costs[(SLOTS, r)]) for r in range(1, 10))
    for (r0, c0), (r1, c1) in zip(points, points[1:]):
        if rows <= r1:
            return c0 + (c1 - c0) * (rows - r0) / (r1 - r0)
    (r0, c0), (r1, c1) = points[-2:]
    return c1 + (c1 - c0) * (rows - r1) / (r1 - r0)


def replay(jobs: list[tuple[str, int]], costs: dict[tuple[int, int], float], drafts: int) -> float:
    """Seconds of the closed loop over ``jobs`` (kind, tokens) with ``drafts`` accepted per
    copy-heavy step (0: speculation off); a job's first token comes from its (left out) prefill."""
    pending = [tokens - 1 for _, tokens in jobs]
    kinds = [kind for kind, _ in jobs]
    active: list[int] = []
    queue = list(range(len(jobs)))
    seconds = 0.0
    while queue or active:
        while queue and len(active) < SLOTS:
            active.append(queue.pop(0))
        takes = {j: min(pending[j], 1 + (drafts if kinds[j] == "copy" else 0)) for j in active}
        seconds += cost_of(costs, sum(takes.values()))
        for j, n in takes.items():
            pending[j] -= n
        active = [j for j in active if pending[j] > 0]
    return seconds


def serving_jobs(path: Path, quant: str) -> list[tuple[str, int]]:
    """(kind, completion tokens) of the first spec-off serving round of ``quant`` in a
    bench.speculative CSV, in queue order."""
    with path.open() as handle:
        rows = [r for r in csv.DictReader(handle)
                if r["quant"] == quant and r["mode"] == "serving" and r["speculative"] == "False"]
    first_wall = rows[0]["wall_s"]
    return [(r["kind"], int(r["completion_tokens"])) for r in rows if r["wall_s"] == first_wall]


def measured_loop_x(jobs_from: Path, quant: str) -> float | None:
    """The serving loop's measured on/off ratio in the JSON beside the jobs' CSV, if there."""
    try:
        return json.loads(jobs_from.with_suffix(".json").read_text())["summary"][quant]["batch8_x"]
    except (OSError, KeyError, ValueError):
        return None


def plot(ceilings: dict[int, float], target: float, measured: float | None, path: Path, title: str) -> None:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6, 3.5))
    ks = sorted(ceilings)
    ax.bar([str(k) for k in ks], [ceilings[k] for k in ks], color="#4a7", label="ceiling, every draft accepted")
    ax.axhline(target, color="#c33", linestyle="--", label=f"target {target}x")
    if measured is not None:
        ax.axhline(measured, color="#36c", linestyle=":", label=f"measured (bench.speculative) {measured}x")
    ax.axhline(1.0, color="#888", linewidth=0.8)
    ax.set_xlabel("drafts per copy-heavy step, every one accepted")
    ax.set_ylabel("serving loop, on / off")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quant", default="auto", help="MINISERVE_QUANT (default: the default setting)")
    parser.add_argument("--jobs-from", default="results/xeon/speculative.csv",
                        help="a bench.speculative CSV whose spec-off serving round gives the jobs")
    parser.add_argument("--context", type=int, default=400)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--out", default="results/xeon")
    args = parser.parse_args(argv)
    engine = Engine(load_settings(quant=args.quant, max_batch=SLOTS)).load()
    quant = engine.loaded.quant
    jobs = serving_jobs(Path(args.jobs_from), quant)
    costs = engine.loop.call(lambda: step_costs(engine, args.context, args.rounds))
    off = replay(jobs, costs, 0)
    measured = measured_loop_x(Path(args.jobs_from), quant)
    ceilings = {k: round(off / replay(jobs, costs, k), 3) for k in range(1, 9)}
    best = max(ceilings, key=ceilings.get)
    info = {**machine(), "cpu_model": cpu_model(), "read_bandwidth_gbs": round(read_bandwidth_gbs(), 1),
            "quant": quant,
            "command": "python -m bench.spec_ceiling " + " ".join(argv if argv is not None else sys.argv[1:])}
    report: dict[str, Any] = {
        "machine": info, "jobs": len(jobs), "jobs_from": args.jobs_from, "context": args.context,
        "step_ms": {f"{b}x{r}": round(c * 1e3, 2) for (b, r), c in costs.items()},
        "loop_off_s": round(off, 3), "ceiling_x_by_drafts": ceilings, "best_drafts": best,
        "ceiling_x": ceilings[best], "target_x": 1.3, "measured_loop_x": measured}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    write_json(out / f"spec_ceiling_{quant}.json", report)
    plot(ceilings, 1.3, measured, out / f"spec_ceiling_{quant}.png",
         f"{quant}: serving loop of 8, speculation on / off ({info['cpu_model']})")
    print(f"{quant}: 8x1 step {costs[(SLOTS, 1)] * 1e3:.1f} ms, 8x5 {costs[(SLOTS, 5)] * 1e3:.1f} ms, "
          f"8x9 {costs[(SLOTS, 9)] * 1e3:.1f} ms; loop ceiling {ceilings[best]}x at {best} drafts "
          f"(all: {ceilings}); target 1.3x")
    engine.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
