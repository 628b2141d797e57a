"""Loop fairness: does a ``paged`` stream keep its pace while every other method runs?

    python -m bench.fairness [--new-tokens 128] [--model default] [--dtype bfloat16] [--threads 0]
    python -m bench.fairness --long-prompt ...   (a prompt that fills the pool beside streams: bench/long_prompt.py)

One ``paged`` job streams while one job of each other method (``official``, ``no_cache``,
``custom_cache``, ``prefix_cache``) runs ``--new-tokens`` tokens on the same engine loop.
The loop gives every running request one token per turn, so the paged job's gaps between
two streamed pieces should stay even: the target is a largest gap at most 3x the median.
Reports those gaps (wall clock, as the client sees them) and each method's time to first
token and decode tok/s in that mix. Writes ``results/fairness.json``, ``.csv`` and ``.png``.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from bench.stats import machine_info, print_table, pyplot, write_csv, write_json
from core.methods import BATCHED_METHOD, SOLO_METHODS
from core.settings import load_settings

TARGET_RATIO = 3.0
PREFIX = "You are MiniServe's assistant. Answer in plain sentences."
QUESTION = ("Write a long, detailed essay of at least 400 words on how a web service can stream the "
            "answer of a language model to many users at once.")  # long: every job runs its whole budget


def _request(method: str, tokens: int) -> Any:
    from engine.types import GenerationRequest, SamplingParams

    # ignore nothing: a job may stop early at an end-of-sequence token; its row says so
    return GenerationRequest(messages=[{"role": "user", "content": QUESTION}], prefix=PREFIX, method=method,
                             sampling=SamplingParams(max_new_tokens=tokens))


def _mix(engine: Any, tokens: int) -> tuple[list[float], dict[str, Any]]:
    """Run the paged job and one job per solo method together; (paged arrivals, results)."""
    arrivals: list[float] = []
    # the paged job is longer so that it streams through the whole of the others' runs
    paged = engine.loop.submit(_request(BATCHED_METHOD, tokens + tokens // 4))
    solos = {m: engine.loop.submit(_request(m, tokens)) for m in SOLO_METHODS}
    results = {BATCHED_METHOD: paged.stream(lambda _piece: arrivals.append(time.monotonic()))}
    results.update({m: h.result() for m, h in solos.items()})
    return arrivals, results


def _rows(results: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"method": m, "completion_tokens": r.usage.completion_tokens, "finish_reason": r.finish_reason,
             "ttft_s": round(r.timings.ttft_s, 3), "decode_tok_s": round(r.timings.decode_tokens_per_s, 2),
             "total_s": round(r.timings.total_s, 2)} for m, r in results.items()]


def _plot(arrivals: list[float], path: Path) -> None:
    plt = pyplot()
    gaps = [(b - a) * 1000 for a, b in zip(arrivals, arrivals[1:])]
    fig, ax = plt.subplots(figsize=(8, 4))
    ax.plot(range(1, len(gaps) + 1), gaps, label="paged gap between pieces (ms)")
    ax.axhline(statistics.median(gaps) * TARGET_RATIO, linestyle="--", color="grey", label="3x median")
    ax.set_xlabel("streamed piece")
    ax.set_ylabel("ms")
    ax.set_title("paged stream while official, no_cache, custom_cache, prefix_cache run")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def torch_threads() -> int:
    import torch

    return torch.get_num_threads()


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if "--long-prompt" in argv:  # a long prompt beside streams: its own module, same command
        from bench import long_prompt

        return long_prompt.main([a for a in argv if a != "--long-prompt"])
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--model", default="default")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    parser.add_argument("--out", default="results")
    args = parser.parse_args(argv)

    from engine.engine import Engine

    engine = Engine(load_settings(model=args.model, dtype=args.dtype, threads=args.threads))
    engine.load()
    for method in (BATCHED_METHOD, *SOLO_METHODS):  # first-use costs (forward, pool, generate) out of the mix
        engine.generate(_request(method, 4))
    started = time.perf_counter()
    arrivals, results = _mix(engine, args.new_tokens)
    wall_s = time.perf_counter() - started
    engine.close()

    gaps = [b - a for a, b in zip(arrivals, arrivals[1:])]
    median, largest = statistics.median(gaps), max(gaps)
    rows = _rows(results)
    summary: dict[str, Any] = {
        "paged_median_gap_ms": round(median * 1000, 1), "paged_max_gap_ms": round(largest * 1000, 1),
        "max_gap_over_median": round(largest / median, 2), "target_max_over_median": TARGET_RATIO,
        "paged_pieces": len(arrivals), "new_tokens_per_job": args.new_tokens, "mix_wall_s": round(wall_s, 1),
        "quant": engine.loaded.quant, "dtype": args.dtype, "threads": torch_threads()}
    summary.update({row["method"]: f"TTFT {row['ttft_s']} s, {row['decode_tok_s']} tok/s, {row['completion_tokens']} tokens"
                    for row in rows})
    print_table(rows, list(rows[0]))
    print({k: summary[k] for k in ("paged_median_gap_ms", "paged_max_gap_ms", "max_gap_over_median", "mix_wall_s")})

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    command = "python -m bench.fairness " + " ".join(argv)
    write_json(out / "fairness.json", {"command": command.strip(), "machine": machine_info(),
                                       "summary": summary, "methods": rows})
    write_csv(out / "fairness.csv", rows)
    _plot(arrivals, out / "fairness.png")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
