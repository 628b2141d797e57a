"""``python -m bench.exact_ops``: `none`'s batched bf16 step with its exact C operations and with torch's.

`none` must keep torch's bits (greedy-identical to `official`), so its linears stay oneDNN's and
only operations C reproduces bit for bit move to C (engine.exact_ops: RMSNorm in torch's
summation order, rotary, the paged K/V gather, silu * up). This times the scheduler's decode-only
step of 8 sequences (one row each) at a short context, like bench.batching's jobs, and at a longer
one, with those operations on and off in interleaved rounds (order alternating), and the time
inside the linears (each call timed), so ``step - linears`` is the work outside them. The logits
of the two sides are compared bit for bit (exit 1 if they differ).

Writes ``<out>/exact_ops.json`` and ``.png``.
"""
from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Iterator

import torch

from bench.paged_common import machine, pyplot
from bench.stats import cpu_model, read_bandwidth_gbs, write_json
from core.settings import load_settings
from engine import exact_ops, packed
from engine.engine import Engine
from engine.handwritten import forward_for
from engine.paged.attention import SeqChunk, build_batch
from engine.paged.forward import PagedQwen2

SEQUENCES = 8


@contextlib.contextmanager
def linear_timer() -> Iterator[list[float]]:
    """Seconds spent inside the prepacked linears while the block runs (one running total)."""
    total = [0.0]
    call = packed.PackedLinear.__call__

    def timed(self: packed.PackedLinear, x: torch.Tensor) -> torch.Tensor:
        start = time.perf_counter()
        try:
            return call(self, x)
        finally:
            total[0] += time.perf_counter() - start

    packed.PackedLinear.__call__ = timed
    try:
        yield total
    finally:
        packed.PackedLinear.__call__ = call


def measure(engine: Engine, contexts: list[int], rounds: int) -> tuple[dict[str, Any], bool]:
    """Per context and side: median step and linear milliseconds; whether every logit matched."""
    forward = forward_for(engine)
    ops = forward.exact
    if not ops.any:
        raise SystemExit("the exact C operations are off on this machine (see the exact_c_ops log event)")
    paged, block = PagedQwen2(forward), engine.settings.kv_block_size
    per_seq = -(-(max(contexts) + 1) // block)
    pool = paged.make_pool(SEQUENCES * per_seq, block)
    tables = [list(range(s * per_seq, (s + 1) * per_seq)) for s in range(SEQUENCES)]
    generator = torch.Generator().manual_seed(0)
    vocab = forward.config.vocab_size
    for table in tables:
        paged.forward(torch.randint(0, vocab, (max(contexts),), generator=generator),
                      build_batch([SeqChunk(table, 0, max(contexts))], block), pool)
    samples = {(c, side): ([], []) for c in contexts for side in ("c", "torch")}
    identical = True
    for round_ in range(rounds + 1):                          # round 0 warms both sides
        for context in contexts:
            batch = build_batch([SeqChunk(t, context, 1) for t in tables], block)
            ids = torch.randint(0, vocab, (SEQUENCES,), generator=generator)
            logits = {}
            for side in (("c", "torch") if round_ % 2 == 0 else ("torch", "c")):
                forward.exact = ops if side == "c" else exact_ops.NONE
                with linear_timer() as linears:
                    start = time.perf_counter()
                    logits[side] = paged.forward(ids, batch, pool, decode_only=True)
                    elapsed = time.perf_counter() - start
                if round_:
                    samples[(context, side)][0].append(elapsed)
                    samples[(context, side)][1].append(linears[0])
            identical &= torch.equal(logits["c"], logits["torch"])
    forward.exact = ops
    result: dict[str, Any] = {"ops": {"norm_rotary": ops.norm_rotary, "silu": ops.silu}}
    for (context, side), (steps, linears) in samples.items():
        step_ms, linear_ms = statistics.median(steps) * 1e3, statistics.median(linears) * 1e3
        result[f"{context}/{side}"] = {"context": context, "side": side, "step_ms": round(step_ms, 2),
                                       "linears_ms": round(linear_ms, 2), "outside_ms": round(step_ms - linear_ms, 2)}
    return result, identical


def plot(rows: dict[str, Any], contexts: list[int], path: Path, title: str) -> None:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6, 3.5))
    labels, linears, outside = [], [], []
    for context in contexts:
        for side, name in (("torch", "torch's ops"), ("c", "exact C ops")):
            row = rows[f"{context}/{side}"]
            labels.append(f"{name}\n{context} tokens")
            linears.append(row["linears_ms"])
            outside.append(row["outside_ms"])
    ax.bar(labels, linears, color="#999", label="inside the linears")
    ax.bar(labels, outside, bottom=linears, color="#4a7", label="outside them")
    ax.set_ylabel("ms per 8-row decode step (median)")
    ax.set_title(title, fontsize=9)
    ax.tick_params(axis="x", labelsize=7)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--contexts", type=int, nargs="+", default=[48, 400])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--out", default="results")
    args = parser.parse_args(argv)
    engine = Engine(load_settings(quant="none", max_batch=SEQUENCES)).load()
    rows, identical = engine.loop.call(lambda: measure(engine, args.contexts, args.rounds))
    info = {**machine(), "cpu_model": cpu_model(), "read_bandwidth_gbs": round(read_bandwidth_gbs(), 1),
            "command": "python -m bench.exact_ops " + " ".join(argv if argv is not None else sys.argv[1:])}
    speedup = {str(c): round(rows[f"{c}/torch"]["step_ms"] / rows[f"{c}/c"]["step_ms"], 3) for c in args.contexts}
    ops = rows.pop("ops")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    write_json(out / "exact_ops.json", {"machine": info, "sequences": SEQUENCES, "rounds": args.rounds, "ops": ops,
                                        "steps": rows, "step_speedup": speedup, "logits_identical": identical})
    plot(rows, args.contexts, out / "exact_ops.png", f"none, 8-row decode step ({info['cpu_model']}, 2 threads)")
    for key, row in rows.items():
        print(f"{key:>12}: step {row['step_ms']:.1f} ms, linears {row['linears_ms']:.1f}, "
              f"outside {row['outside_ms']:.1f}")
    print(f"step speedup {speedup}; logits bit-identical: {identical}")
    engine.close()
    return 0 if identical else 1


if __name__ == "__main__":
    sys.exit(main())
