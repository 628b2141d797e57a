"""Prefix cache: miss vs hit vs ``official`` for a short and a long (>= 1,000 token) system prefix.

    python -m bench.prefix_cache [--repeats 5] [--new-tokens 16]

Each round runs the three cases in a rotated order: ``official`` (no cache), ``prefix_cache``
*miss* (the store is cleared first) and ``prefix_cache`` *hit* (the prefix was stored by an
earlier run). The user question changes every round, so only the prefix can be reused.
Reports p50 time to first token and end-to-end latency, the miss/hit speed-up, and whether
the three produced the same tokens. Writes ``results/prefix_cache.csv``, ``.summary.csv``
and ``.png``.

    python -m bench.prefix_cache --isolation

probes the cache's side channel between two API keys through the web instead
(:mod:`bench.cache_isolation`, ``results/cache_isolation.json``).
"""
from __future__ import annotations

import argparse
import time
from pathlib import Path

from bench.stats import machine_info, percentile, print_table, pyplot, write_csv, write_json
from core.settings import load_settings

SHORT_PREFIX = "You are MiniServe's assistant. Answer briefly and precisely."
_PARAGRAPH = ("Notes on the MiniServe service. Jobs are queued in Redis and served by Celery "
              "workers that hold the model in memory. Every token is appended to the job's event "
              "stream, so a client that connects late replays the stream from the start. "
              "服务把每个任务放进队列，由工作进程生成文本，并把每一段文字写入事件流。 ")
CASES = ("official", "miss", "hit")


def long_prefix(tokenizer, min_tokens: int = 1000) -> str:
    text, index = "", 0
    while len(tokenizer.encode(text)) < min_tokens:
        index += 1
        text += f"[{index}] " + _PARAGRAPH
    return "Use the following notes to answer.\n" + text


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--new-tokens", type=int, default=16)
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--model", default="default")
    parser.add_argument("--out", default="results")
    parser.add_argument("--isolation", action="store_true",
                        help="probe the cache's side channel between two API keys instead (bench.cache_isolation)")
    args = parser.parse_args(argv)
    if args.isolation:
        from bench import cache_isolation

        return cache_isolation.main(args)

    from engine.engine import Engine
    from engine.handwritten import prefix_store
    from engine.types import GenerationRequest, SamplingParams

    # official's TTFT is generate's, not the reload of freed full-precision weights (engine.quant.restore)
    engine = Engine(load_settings(model=args.model, dtype=args.dtype, official_keep_weights=True))
    engine.load()
    store = prefix_store(engine)
    prefixes = {"short": SHORT_PREFIX, "long": long_prefix(engine.loaded.tokenizer)}

    def once(kind: str, case: str, question: str):
        method = "official" if case == "official" else "prefix_cache"
        if case == "miss":
            store.clear()
        request = GenerationRequest(messages=[{"role": "user", "content": question}], prefix=prefixes[kind],
                                    method=method, sampling=SamplingParams(max_new_tokens=args.new_tokens))
        if case == "hit" and engine.prompt(request).prefix_ids not in store:
            engine.generate(request)  # store the prefix first (not timed)
        return engine.generate(request)

    for kind in prefixes:  # warmup
        for case in CASES:
            once(kind, case, "warm up")
    started = time.perf_counter()
    rows = []
    for repeat in range(args.repeats):
        question = f"Question {repeat}: what happens to a job's tokens when a client connects late?"
        for kind in prefixes:
            order = CASES[repeat % 3:] + CASES[:repeat % 3]
            for case in order:
                result = once(kind, case, question)
                rows.append({"prefix": kind, "case": case, "repeat": repeat,
                             "prompt_tokens": result.usage.prompt_tokens, "cached_tokens": result.usage.cached_tokens,
                             "ttft_s": result.timings.ttft_s, "total_s": result.timings.total_s,
                             "token_ids": " ".join(map(str, result.token_ids))})
                print(f"{kind:5s} {case:8s} ttft {result.timings.ttft_s * 1000:7.1f} ms  "
                      f"total {result.timings.total_s:6.2f} s  cached {result.usage.cached_tokens}", flush=True)

    summary = []
    for kind in prefixes:
        group = [r for r in rows if r["prefix"] == kind]
        miss_ttft = percentile([r["ttft_s"] for r in group if r["case"] == "miss"], 50)
        for case in CASES:
            runs = [r for r in group if r["case"] == case]
            ttft = percentile([r["ttft_s"] for r in runs], 50)
            summary.append({"prefix": kind, "case": case, "prompt_tokens": runs[0]["prompt_tokens"],
                            "cached_tokens": runs[0]["cached_tokens"], "p50_ttft_ms": ttft * 1000,
                            "p50_total_s": percentile([r["total_s"] for r in runs], 50),
                            "ttft_speedup_vs_miss": miss_ttft / ttft if ttft else 0.0,
                            "same_tokens_in_round": all(
                                len({r["token_ids"] for r in group if r["repeat"] == k}) == 1
                                for k in range(args.repeats))})
    out = Path(args.out)
    write_csv(out / "prefix_cache.csv", rows)
    write_csv(out / "prefix_cache.summary.csv", summary)
    machine = machine_info() | {"model": args.model, "dtype": args.dtype, "repeats": args.repeats,
                                "new_tokens": args.new_tokens, "wall_s": round(time.perf_counter() - started, 1),
                                "store": store.stats()}
    write_json(out / "prefix_cache.machine.json", machine)
    plot(summary, out / "prefix_cache.png")
    print(f"\nmachine: {machine}")
    print_table(summary, ["prefix", "case", "prompt_tokens", "cached_tokens", "p50_ttft_ms", "p50_total_s",
                          "ttft_speedup_vs_miss", "same_tokens_in_round"])
    return 0


def plot(summary: list[dict], path: Path) -> None:
    plt = pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    kinds = sorted({s["prefix"] for s in summary}, reverse=True)
    width = 0.8 / len(CASES)
    for i, case in enumerate(CASES):
        rows = [next(s for s in summary if s["prefix"] == k and s["case"] == case) for k in kinds]
        xs = [j + i * width for j in range(len(kinds))]
        axes[0].bar(xs, [r["p50_ttft_ms"] for r in rows], width, label=case)
        axes[1].bar(xs, [r["p50_total_s"] for r in rows], width, label=case)
    for ax, title in zip(axes, ("p50 time to first token, ms", "p50 end-to-end, s")):
        ax.set_xticks([j + width for j in range(len(kinds))],
                      [f"{k} prefix\n({next(s for s in summary if s['prefix'] == k)['prompt_tokens']} tok prompt)"
                       for k in kinds])
        ax.set_title(title)
        ax.legend()
    axes[0].set_yscale("log")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    raise SystemExit(main())
