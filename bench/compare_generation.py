"""``official`` vs ``no_cache`` vs ``custom_cache`` on the same greedy request, side by side.

    python -m bench.compare_generation --repeats 5 [--dtype bfloat16|float32|both]

For each dtype: load the engine once, warm every method up, then ``--repeats`` rounds; each
round runs every (method, new-token count) pair once, in an order rotated per round so no
method always runs first. Reports mean and p50 latency, p50 time to first token, p50 decode
tokens/s, the decode speed-up over ``official``, and whether every method produced exactly
``official``'s tokens. The machine's read bandwidth (``bench.stats.read_bandwidth_gbs``) is
measured before and after each dtype, and each method's decode speed is also given as a
share of its floor (bandwidth / weight bytes read per token). ``--quant`` (default
``none``, so every method runs the same full-precision weights and the equality column
means something) sets ``MINISERVE_QUANT``. Writes ``results/compare_generation[_<dtype>].csv`` (every run),
``.summary.csv``, ``.machine.json`` and ``.png`` (suffix ``_<dtype>`` when one dtype is asked for).
"""
from __future__ import annotations

import argparse
import time
from pathlib import Path

from bench.stats import machine_info, percentile, print_table, pyplot, read_bandwidth_gbs, write_csv, write_json
from core.settings import load_settings

METHODS = ("official", "no_cache", "custom_cache")
PROMPT = [{"role": "user", "content": "Write a long story about a dragon who learns to cook. 写得生动一些。"}]


def run_dtype(dtype: str, args: argparse.Namespace) -> list[dict]:
    from engine.engine import Engine
    from engine.types import GenerationRequest, SamplingParams

    from engine.handwritten import forward_for
    from engine.quant.model import bytes_per_token

    # official's timings are generate's, not the reload of freed full-precision weights (engine.quant.restore)
    engine = Engine(load_settings(model=args.model, dtype=dtype, threads=args.threads, quant=args.quant,
                                  official_keep_weights=True))
    engine.load()
    step_bytes = bytes_per_token(forward_for(engine).weights)
    bandwidth = [read_bandwidth_gbs()]

    def once(method: str, tokens: int):
        request = GenerationRequest(messages=PROMPT, method=method,
                                    sampling=SamplingParams(max_new_tokens=tokens))
        return engine.generate(request)

    for method in METHODS:  # warmup: first calls pay for allocator and kernel set-up
        once(method, 4)
    pairs = [(m, t) for t in args.tokens for m in METHODS]
    rows = []
    for repeat in range(args.repeats):
        shift = repeat % len(pairs)
        for method, tokens in pairs[shift:] + pairs[:shift]:
            result = once(method, tokens)
            rows.append({"dtype": dtype, "method": method, "new_tokens": tokens, "repeat": repeat,
                         "total_s": result.timings.total_s, "ttft_s": result.timings.ttft_s,
                         "decode_tok_s": result.timings.decode_tokens_per_s,
                         "completion_tokens": result.usage.completion_tokens,
                         "prompt_tokens": result.usage.prompt_tokens, "bytes_per_token": step_bytes,
                         "token_ids": " ".join(map(str, result.token_ids))})
            print(f"{dtype} {method:12s} {tokens:3d} tok  {result.timings.total_s:6.2f} s  "
                  f"ttft {result.timings.ttft_s * 1000:6.0f} ms  {result.timings.decode_tokens_per_s:5.1f} tok/s",
                  flush=True)
    bandwidth.append(read_bandwidth_gbs())
    for row in rows:
        row["read_gbs"] = percentile(bandwidth, 50)
    print(f"{dtype}: read bandwidth {bandwidth} GB/s, {step_bytes / 1e6:.0f} MB of weights per token", flush=True)
    del engine
    return rows


def summarize(rows: list[dict]) -> list[dict]:
    out = []
    keys = sorted({(r["dtype"], r["new_tokens"]) for r in rows})
    for dtype, tokens in keys:
        group = [r for r in rows if r["dtype"] == dtype and r["new_tokens"] == tokens]
        reference = {r["token_ids"] for r in group if r["method"] == "official"}
        base_tps = percentile([r["decode_tok_s"] for r in group if r["method"] == "official"], 50)
        for method in METHODS:
            runs = [r for r in group if r["method"] == method]
            totals = [r["total_s"] for r in runs]
            tps = percentile([r["decode_tok_s"] for r in runs], 50)
            floor = runs[0]["read_gbs"] * 1e9 / runs[0]["bytes_per_token"]
            out.append({"dtype": dtype, "new_tokens": tokens, "method": method, "runs": len(runs),
                        "mean_s": sum(totals) / len(totals), "p50_s": percentile(totals, 50),
                        "p50_ttft_ms": percentile([r["ttft_s"] for r in runs], 50) * 1000,
                        "p50_decode_tok_s": tps, "decode_vs_official": tps / base_tps if base_tps else 0.0,
                        "read_gbs": runs[0]["read_gbs"], "floor_tok_s": floor, "pct_of_floor": 100 * tps / floor,
                        "generated": runs[0]["completion_tokens"],
                        "identical_to_official": len(reference) == 1 and all(
                            r["token_ids"] in reference for r in runs)})
    return out


def plot(summary: list[dict], path: Path) -> None:
    plt = pyplot()
    groups = sorted({(s["dtype"], s["new_tokens"]) for s in summary})
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    width = 0.8 / len(METHODS)
    for i, method in enumerate(METHODS):
        rows = [next(s for s in summary if (s["dtype"], s["new_tokens"]) == g and s["method"] == method) for g in groups]
        xs = [j + i * width for j in range(len(groups))]
        axes[0].bar(xs, [r["p50_decode_tok_s"] for r in rows], width, label=method)
        axes[1].bar(xs, [r["p50_s"] for r in rows], width, label=method)
    labels = [f"{d}\n{t} tok" for d, t in groups]
    for ax, title in zip(axes, ("p50 decode tokens/s (higher is better)", "p50 end-to-end latency, s")):
        ax.set_xticks([j + width for j in range(len(groups))], labels)
        ax.set_title(title)
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def write_results(rows: list[dict], args: argparse.Namespace, dtype: str, wall_s: float) -> None:
    """One dtype's files, ``compare_generation_<dtype>.*`` (what ``python -m bench report`` reads)."""
    summary = summarize(rows)
    stem = Path(args.out) / f"compare_generation_{dtype}"
    write_csv(stem.with_suffix(".csv"), rows)
    write_csv(stem.with_suffix(".summary.csv"), summary)
    machine = machine_info() | {"model": args.model, "dtype": dtype, "repeats": args.repeats, "wall_s": round(wall_s, 1)}
    write_json(stem.with_suffix(".machine.json"), machine)
    plot(summary, stem.with_suffix(".png"))
    print(f"\nmachine: {machine}")
    print_table(summary, ["dtype", "new_tokens", "method", "runs", "mean_s", "p50_s", "p50_ttft_ms",
                          "p50_decode_tok_s", "decode_vs_official", "pct_of_floor", "generated",
                          "identical_to_official"])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--dtype", choices=("bfloat16", "float32", "both"), default="both")
    parser.add_argument("--tokens", type=int, nargs="+", default=[16, 64])
    parser.add_argument("--model", default="default")
    parser.add_argument("--threads", type=int, default=0)
    parser.add_argument("--quant", default="none", help="MINISERVE_QUANT for the run (default none)")
    parser.add_argument("--out", default="results")
    args = parser.parse_args(argv)
    dtypes = ("bfloat16", "float32") if args.dtype == "both" else (args.dtype,)
    for dtype in dtypes:  # each dtype's files are written when it ends: a long run keeps what it measured
        started = time.perf_counter()
        write_results(run_dtype(dtype, args), args, dtype, time.perf_counter() - started)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
