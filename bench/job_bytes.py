"""Redis bytes per finished 1,000-token job, before and after issue 15's item 8:
``python -m bench.job_bytes [--tokens 1000] [--rates 10,20,50,200]``.

Both sides run the same Lua scripts on a private ``redis-server`` and are measured with
``MEMORY USAGE <key> SAMPLES 0`` (the job hash + its event stream):

* **before** -- main's code path as it was: one token event per text chunk, the result
  (with ``token_ids``) stored in the hash *and* as the terminal event's data. Reproduced by
  calling the same ``FINISH`` script with the full payload as the event data.
* **after** -- this code: chunks coalesced by ``core.coalesce.TextCoalescer``
  (``MINISERVE_TOKEN_EVENT_INTERVAL_MS``, 100 ms) at a simulated decode rate, the result
  stored once (the terminal event holds ``core.payloads.event_summary``), no ``token_ids``.

The chunks are the default model's tokens of an English/Chinese text when its tokenizer is
prepared (else 4-character pieces). Sizes do not depend on timing, so the figures are exact
for the given rate; the rate only decides how many chunks share an event.
Writes ``results/job_bytes.{json,csv,png}``.
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import redis

from bench.stack import start_redis
from bench.stats import cpu_model, machine_info, print_table, write_csv, write_json
from core import keys
from core.coalesce import TextCoalescer
from core.events import SUCCEEDED, TOKEN
from core.jobs import JobStore
from core.model_source import local_model_dir
from core.settings import get_settings

TEXT = ("A KV cache keeps the keys and values of every past token so each new token attends to them "
        "without recomputing the prefix. 分页 KV 缓存把缓存切成固定大小的块，按块表查找。 ")


def token_chunks(n: int) -> tuple[list[str], list[int], str]:
    """``n`` text chunks (and ids) as the worker would stream them, and what made them."""
    folder = local_model_dir(get_settings())
    tokenizer_file = folder / "tokenizer.json" if folder else None
    if tokenizer_file is not None and tokenizer_file.is_file():
        from tokenizers import Tokenizer

        tokenizer = Tokenizer.from_file(str(tokenizer_file))
        ids = tokenizer.encode(TEXT * (n // 20 + 2), add_special_tokens=False).ids[:n]
        return [tokenizer.decode([i]) for i in ids], ids, "default model tokenizer"
    text = (TEXT * (n // 10 + 2))[: 4 * n]
    return [text[i:i + 4] for i in range(0, 4 * n, 4)], list(range(151_000, 151_000 + n)), "4-char pieces"


def result_payload(chunks: list[str], ids: list[int], rate: float) -> dict[str, Any]:
    """A result shaped like ``engine.types.GenerationResult.to_dict()``."""
    total = len(chunks) / rate
    return {"text": "".join(chunks), "finish_reason": "length",
            "usage": {"prompt_tokens": 24, "completion_tokens": len(chunks), "cached_tokens": 0},
            "timings": {"ttft_s": 0.0812, "total_s": round(total, 4), "decode_tokens_per_s": rate},
            "method": "paged", "token_ids": ids}


def job_bytes(client: redis.Redis, job_id: str) -> dict[str, int]:
    hash_b = int(client.memory_usage(keys.job_key(job_id), samples=0) or 0)
    stream_b = int(client.memory_usage(keys.events_key(job_id), samples=0) or 0)
    return {"hash_bytes": hash_b, "stream_bytes": stream_b, "total_bytes": hash_b + stream_b,
            "events": int(client.xlen(keys.events_key(job_id)))}


def run_before(store: JobStore, chunks: list[str], payload: dict[str, Any]) -> str:
    """Main's path: an event per chunk; result + token_ids in the hash and in the event."""
    job = store.create("generate", "generation", {"messages": [{"role": "user", "content": "x"}]})
    attempt = store.start_attempt(job.id, "bench", 60).attempt
    for chunk in chunks:
        store.append_event(job.id, attempt, TOKEN, {"text": chunk})
    full = json.dumps(payload, ensure_ascii=False)
    store._scripts["FINISH"](keys=store._job_keys(job.id) + [keys.LEASES],
                             args=[job.id, SUCCEEDED, "done", attempt, repr(time.time()), full,
                                   store.ttl_s, "result", full])
    return job.id


def run_after(store: JobStore, chunks: list[str], payload: dict[str, Any], rate: float, interval_s: float) -> str:
    """This code: coalesced events at ``rate`` tokens/s, one copy of the result, no token ids."""
    job = store.create("generate", "generation", {"messages": [{"role": "user", "content": "x"}]})
    attempt = store.start_attempt(job.id, "bench", 60).attempt
    clock = [0.0]
    text = TextCoalescer(interval_s, clock=lambda: clock[0])
    for chunk in chunks:
        out = text.add(chunk)
        if out:
            store.append_event(job.id, attempt, TOKEN, {"text": out})
        clock[0] += 1.0 / rate
    if (rest := text.flush()) is not None:
        store.append_event(job.id, attempt, TOKEN, {"text": rest})
    store.finish(job.id, SUCCEEDED, payload, attempt=attempt)
    return job.id


def measure(client: redis.Redis, tokens: int, rates: list[float], interval_s: float) -> tuple[list[dict], str]:
    store = JobStore(client, ttl_s=3600)
    chunks, ids, source = token_chunks(tokens)
    rows = []
    for rate in rates:
        payload = result_payload(chunks, ids, rate)
        before = job_bytes(client, run_before(store, chunks, payload))
        after = job_bytes(client, run_after(store, chunks, payload, rate, interval_s))
        rows.append({"tokens": len(chunks), "tokens_per_s": rate,
                     **{f"before_{k}": v for k, v in before.items()},
                     **{f"after_{k}": v for k, v in after.items()},
                     "ratio": round(before["total_bytes"] / after["total_bytes"], 2)})
    return rows, source


def plot(rows: list[dict], path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [f"{r['tokens_per_s']:g} tok/s" for r in rows]
    fig, ax = plt.subplots(figsize=(8, 4))
    x = range(len(rows))
    for offset, side in ((-0.2, "before"), (0.2, "after")):
        ax.bar([i + offset for i in x], [r[f"{side}_stream_bytes"] / 1024 for r in rows], 0.4,
               label=f"{side}: stream")
        ax.bar([i + offset for i in x], [r[f"{side}_hash_bytes"] / 1024 for r in rows], 0.4,
               bottom=[r[f"{side}_stream_bytes"] / 1024 for r in rows], label=f"{side}: hash")
    ax.set_xticks(list(x), labels)
    ax.set_ylabel(f"KiB in Redis per {rows[0]['tokens']}-token job")
    ax.set_title("Redis memory per finished job (MEMORY USAGE, hash + event stream)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tokens", type=int, default=1000)
    parser.add_argument("--rates", default="10,20,50,200", help="simulated decode rates, tokens/s per job")
    parser.add_argument("--interval-ms", type=float, default=get_settings().token_event_interval_ms)
    parser.add_argument("--output", default="results/job_bytes")
    args = parser.parse_args(argv)
    rates = [float(r) for r in args.rates.split(",")]
    proc, url = start_redis(Path(tempfile.mkdtemp(prefix="job-bytes-")))
    try:
        client = redis.Redis.from_url(url, decode_responses=True)
        rows, source = measure(client, args.tokens, rates, args.interval_ms / 1000)
        server = client.info("server").get("redis_version")
    finally:
        proc.kill()
    print_table(rows, ["tokens_per_s", "before_hash_bytes", "before_stream_bytes", "before_events",
                       "after_hash_bytes", "after_stream_bytes", "after_events", "ratio"])
    out = Path(args.output)
    summary = {"command": "python -m bench.job_bytes " + " ".join(argv if argv is not None else sys.argv[1:]),
               "chunks": source, "interval_ms": args.interval_ms, "redis": server, "cpu": cpu_model(),
               "machine": machine_info(), "rows": rows,
               "note": "bytes are MEMORY USAGE SAMPLES 0 of job:{id} + job:{id}:events; not timing-dependent"}
    paths = [write_json(out.with_suffix(".json"), summary), write_csv(out.with_suffix(".csv"), rows),
             plot(rows, out.with_suffix(".png"))]
    print("wrote " + ", ".join(str(p) for p in paths))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
