"""Long prompt beside streams: does one prompt that fills the KV pool stall the others?

    python -m bench.fairness --long-prompt [--stream-tokens 400] [--long-tokens 0] [--budgets 16 64 256]

Three ``paged`` streams of ``--stream-tokens`` tokens each run alone first (unloaded), then
again while a fourth request brings a prompt of ``--long-tokens`` tokens (0: what the pool
holds beside the three streams) that arrives once they stream. The engine loop spends at most
``MINISERVE_PREFILL_TOKENS_WHILE_DECODING`` prompt tokens per turn while others decode, so
the streams keep their pace and the long prompt takes longer instead. Each ``--budgets``
value is measured with its own engine, in one run, so the setting can be chosen from the
table: the streams' largest gap between two pieces, their time against unloaded, and the long
prompt's time to first token. Targets: largest gap at most 1 s, streams within 1.5x unloaded.
Writes ``results/long_prompt.json``.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

from bench.stats import machine_info, print_table, write_json
from core.methods import BATCHED_METHOD
from core.settings import load_settings

STREAMS = 3
MAX_GAP_S, MAX_SLOWDOWN = 1.0, 1.5
QUESTION = "Write a long essay on how a web service streams a language model's answer to many users."
FILLER = "The quick brown fox jumps over the lazy dog while the service keeps every stream moving. "


def _request(text: str, tokens: int) -> Any:
    from engine.types import GenerationRequest, SamplingParams

    return GenerationRequest(messages=[{"role": "user", "content": text}], method=BATCHED_METHOD,
                             sampling=SamplingParams(max_new_tokens=tokens, ignore_eos=True))


def _long_text(engine: Any, tokens: int) -> str:
    """A user message of about ``tokens`` tokens (the filler sentence repeated)."""
    per = len(engine.loaded.tokenizer.encode(FILLER))
    return FILLER * max(1, tokens // per)


def _run_streams(engine: Any, tokens: int, long_text: str | None) -> dict[str, Any]:
    """The streams, and the long request once every stream has its first piece."""
    arrivals: list[list[float]] = [[] for _ in range(STREAMS)]
    first = threading.Barrier(STREAMS + 1)
    started = time.monotonic()

    def follow(i: int) -> None:
        def on_text(_piece: str) -> None:
            if not arrivals[i]:
                first.wait()
            arrivals[i].append(time.monotonic())
        engine.loop.submit(_request(QUESTION, tokens)).stream(on_text)

    threads = [threading.Thread(target=follow, args=(i,)) for i in range(STREAMS)]
    for thread in threads:
        thread.start()
    first.wait()
    long_result = engine.loop.submit(_request(long_text, 1)).result() if long_text else None
    for thread in threads:
        thread.join()
    totals = [a[-1] - started for a in arrivals]
    gaps = [b - a for times in arrivals for a, b in zip(times, times[1:])]
    out = {"streams_total_s": round(statistics.median(totals), 2), "max_gap_s": round(max(gaps), 3),
           "median_gap_ms": round(statistics.median(gaps) * 1000, 1)}
    if long_result is not None:
        out.update(long_prompt_tokens=long_result.usage.prompt_tokens, long_ttft_s=round(long_result.timings.ttft_s, 2))
    return out


def _measure(args: argparse.Namespace, budget: int) -> dict[str, Any]:
    from engine.engine import Engine

    engine = Engine(load_settings(model=args.model, dtype=args.dtype, threads=args.threads,
                                  prefill_tokens_while_decoding=budget))
    engine.load()
    try:
        engine.generate(_request(QUESTION, 4))  # first-use costs out of the runs
        pool = engine.settings.kv_num_blocks * engine.settings.kv_block_size
        long_tokens = args.long_tokens or pool - STREAMS * (args.stream_tokens + 64) - 64
        unloaded = _run_streams(engine, args.stream_tokens, None)
        loaded = _run_streams(engine, args.stream_tokens, _long_text(engine, long_tokens))
    finally:
        engine.close()
    slowdown = loaded["streams_total_s"] / unloaded["streams_total_s"]
    return {"prefill_tokens_while_decoding": budget, "unloaded_total_s": unloaded["streams_total_s"],
            "unloaded_max_gap_s": unloaded["max_gap_s"], "loaded_total_s": loaded["streams_total_s"],
            "slowdown": round(slowdown, 2), "loaded_max_gap_s": loaded["max_gap_s"],
            "loaded_median_gap_ms": loaded["median_gap_ms"], "long_prompt_tokens": loaded["long_prompt_tokens"],
            "long_ttft_s": loaded["long_ttft_s"],
            "meets_targets": loaded["max_gap_s"] <= MAX_GAP_S and slowdown <= MAX_SLOWDOWN}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.fairness --long-prompt", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--stream-tokens", type=int, default=400)
    parser.add_argument("--long-tokens", type=int, default=0, help="0: fill the pool beside the streams")
    parser.add_argument("--budgets", type=int, nargs="+", default=[16, 64, 256])
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--model", default="default")
    parser.add_argument("--threads", type=int, default=0)
    parser.add_argument("--out", default="results")
    args = parser.parse_args(argv)
    rows = [_measure(args, budget) for budget in args.budgets]
    print_table(rows, list(rows[0]))
    command = "python -m bench.fairness --long-prompt " + " ".join(sys.argv[1:] if argv is None else argv)
    write_json(Path(args.out) / "long_prompt.json", {
        "command": command.strip(), "machine": machine_info(), "streams": STREAMS,
        "stream_tokens": args.stream_tokens, "targets": {"max_gap_s": MAX_GAP_S, "slowdown": MAX_SLOWDOWN},
        "rows": rows})
    return 0

