"""Continuous batching throughput: N concurrent jobs on one engine vs one at a time vs
transformers, same prompts, same run.

For each concurrency N (default 1, 2, 4, 8, 16) the first N prompts run
* ``batched``: all N submitted at once to :class:`engine.loop.EngineLoop` (one loop,
  one batched forward per step over the paged KV cache) with the default
  ``MINISERVE_QUANT`` (``auto``: ``q8`` on CPU);
* ``batched_none``: the same with ``MINISERVE_QUANT=none`` (bf16, greedy-identical to
  ``official``);
* ``batched_shared``: ``batched`` with prefix sharing on (the worker's setting, so the
  ``queue`` mode has an in-process twin); every other in-process mode computes its whole
  prompt (sharing off);
* ``sequential``: the same N jobs one after another through the ``paged`` method (default
  setting);
* ``hf_cb``: transformers' continuous batching, ``generate_batch(persistent_manager=True)``
  on a manager created and warmed (one call with N other prompts) *outside* the timed
  window, bf16;
* ``hf_padded``: transformers ``generate`` on the N prompts left-padded into one batch,
  bf16 (the second anchor).
Reported: aggregate tokens/s (generated tokens / wall time, prefill included), p50/p90
time to first token (not available for ``hf_padded``), and ratios. After a warmup, modes run in
``--repeats`` interleaved rounds (rotating order) and each mode reports its median run (one run
per mode let a noisy moment on a shared machine move a ratio by 20%). Greedy, no repetition penalty in any mode (transformers' continuous batching cannot apply one). A last mode
(skip it with ``--no-queue``), ``queue``, sends the same N jobs at once through the real
stack (web -> Redis -> one Celery worker process with a threads pool feeding the paged
scheduler, default settings: prefix sharing on -> Redis -> SSE; see
:mod:`bench.queue_batching`), with TTFT as each client saw it.

    flock /tmp/miniserve-heavy.lock python -m bench.batching [--concurrency 1 2 4 8 16] [--no-queue]
"""
from __future__ import annotations

import argparse
import contextlib
import time
from pathlib import Path

import torch

from bench.stats import RESULTS, machine_info, machine_line, p50, percentile, print_table, pyplot, write_csv, write_json
from core.settings import load_settings
from engine.loop import EngineLoop
from engine.engine import Engine
from engine.openmp import release_thread_team
from engine.types import GenerationRequest, SamplingParams

# Sampling in every mode, ours and transformers': greedy WITHOUT the model's repetition penalty,
# since transformers' continuous batching drops it ("RepetitionPenaltyLogitsProcessor isn't
# supported by CB"): with it, our modes and padded `generate` made a whole-vocabulary pass per
# token that hf_cb skipped.
REPETITION_PENALTY = 1.0

TOPICS = ["a KV cache", "paged attention", "continuous batching", "rotary position embeddings",
          "grouped-query attention", "the softmax function", "a hash table", "gradient descent",
          "a Bloom filter", "TCP slow start", "a B-tree", "the CAP theorem", "garbage collection",
          "a mutex", "Python's GIL", "copy-on-write", "a Merkle tree", "backpropagation",
          "dropout", "beam search"]


def prompts(n: int) -> list[str]:
    return [f"Explain {TOPICS[i % len(TOPICS)]} in detail, step by step." for i in range(n)]


def request(text: str, new_tokens: int) -> GenerationRequest:
    return GenerationRequest(messages=[{"role": "user", "content": text}], method="paged",
                             sampling=SamplingParams(max_new_tokens=new_tokens,
                                                     repetition_penalty=REPETITION_PENALTY))


def run_batched(batch: EngineLoop, texts: list[str], new_tokens: int) -> dict:
    start = time.perf_counter()
    futures = [batch.submit(request(t, new_tokens)) for t in texts]
    results = [f.result() for f in futures]
    wall = time.perf_counter() - start
    return summarize(wall, [r.usage.completion_tokens for r in results],
                     [r.timings.ttft_s for r in results])


def run_sequential(engine: Engine, texts: list[str], new_tokens: int) -> dict:
    start = time.perf_counter()
    tokens, ttfts = [], []
    for t in texts:
        r = engine.generate(request(t, new_tokens))
        tokens.append(r.usage.completion_tokens)
        ttfts.append(time.perf_counter() - start - (r.timings.total_s - r.timings.ttft_s))
    wall = time.perf_counter() - start
    return summarize(wall, tokens, ttfts)


def _hf_config(engine: Engine, new_tokens: int):
    from transformers import GenerationConfig

    loaded = engine.loaded
    return GenerationConfig(max_new_tokens=new_tokens, do_sample=False,
                            repetition_penalty=REPETITION_PENALTY,
                            eos_token_id=loaded.eos_ids, pad_token_id=loaded.eos_ids[-1])


def _ids(engine: Engine, texts: list[str], new_tokens: int) -> list[list[int]]:
    return [engine.prompt(request(t, new_tokens)).ids for t in texts]


def _cb_config(n: int):
    """A bounded cache: by default transformers sizes it from free memory, which on a shared
    CPU machine takes gigabytes (and got a test run OOM-killed). Pages of 256 tokens; a job
    here needs at most one."""
    from transformers import ContinuousBatchingConfig

    return ContinuousBatchingConfig(num_blocks=2 * n + 4, max_batch_tokens=max(512, 64 * n))


def warm_hf_cb(engine: Engine, n: int, new_tokens: int) -> None:
    """A fresh persistent manager sized for ``n`` jobs, warmed on ``n`` other prompts (outside
    the timed window, as a serving process would hold it)."""
    model = engine.loaded.model
    model.destroy_cached_continuous_batching_manager()
    others = [f"Summarize {TOPICS[(i + 7) % len(TOPICS)]} in two sentences." for i in range(n)]
    model.generate_batch(inputs=_ids(engine, others, new_tokens), generation_config=_hf_config(engine, new_tokens),
                         progress_bar=False, persistent_manager=True, continuous_batching_config=_cb_config(n))


def run_hf_cb(engine: Engine, texts: list[str], new_tokens: int) -> dict:
    ids = _ids(engine, texts, new_tokens)
    release_thread_team()  # the manager computes on its own thread: no second OpenMP team beside it
    start = time.perf_counter()
    out = engine.loaded.model.generate_batch(inputs=ids, generation_config=_hf_config(engine, new_tokens),
                                             progress_bar=False, record_timestamps=True, persistent_manager=True,
                                             continuous_batching_config=_cb_config(len(texts)))
    wall = time.perf_counter() - start
    tokens, ttfts = [], []
    for result in out.values():
        tokens.append(len(result.generated_tokens))
        stamps = getattr(result, "timestamps", None) or []
        ttfts.append((stamps[0] - start) if stamps and stamps[0] > start else float("nan"))
    return summarize(wall, tokens, ttfts)


def run_hf_padded(engine: Engine, texts: list[str], new_tokens: int) -> dict:
    """All prompts left-padded into one ``generate`` call; tokens counted up to each row's eos."""
    ids = _ids(engine, texts, new_tokens)
    width = max(len(i) for i in ids)
    pad = engine.loaded.eos_ids[-1]
    input_ids = torch.tensor([[pad] * (width - len(i)) + i for i in ids])
    mask = torch.tensor([[0] * (width - len(i)) + [1] * len(i) for i in ids])
    start = time.perf_counter()
    with torch.inference_mode():
        out = engine.loaded.model.generate(input_ids, attention_mask=mask, generation_config=_hf_config(engine, new_tokens))
    wall = time.perf_counter() - start
    eos = set(engine.loaded.eos_ids)
    tokens = []
    for row in out[:, width:].tolist():
        ends = [k for k, t in enumerate(row) if t in eos]
        tokens.append(ends[0] + 1 if ends else len(row))
    return summarize(wall, tokens, [float("nan")] * len(ids))


def run_queue(runner, texts: list[str], new_tokens: int) -> dict:
    out = runner.run(texts, new_tokens)
    return summarize(out["wall_s"], out["tokens"], out["ttfts"])


def summarize(wall: float, tokens: list[int], ttfts: list[float]) -> dict:
    return {"wall_s": wall, "tokens": sum(tokens), "tok_per_s": sum(tokens) / wall,
            "ttft_p50_s": p50(ttfts), "ttft_p90_s": percentile(ttfts, 90)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 2, 4, 8, 16])
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--no-hf", action="store_true", help="skip transformers generate_batch")
    parser.add_argument("--no-sequential", action="store_true")
    parser.add_argument("--no-queue", action="store_true",
                        help="skip the jobs through web -> Redis -> one Celery worker process")
    parser.add_argument("--quant", default="auto",
                        help="MINISERVE_QUANT of the 'batched' modes (the bf16 modes always run none)")
    parser.add_argument("--repeats", type=int, default=3,
                        help="interleaved rounds per concurrency; each mode's median run is reported")
    parser.add_argument("--output", default=str(RESULTS / "batching.csv"))
    args = parser.parse_args()
    sizes = {"max_batch": max(args.concurrency), "max_batched_tokens": max(512, 64 * max(args.concurrency))}
    engine = Engine(load_settings(quant=args.quant, **sizes)).load()
    bf16 = Engine(load_settings(quant="none", **sizes)).load()
    shared = Engine(engine.settings, engine.loaded)  # the same model, its own loop and caches
    settings = engine.settings
    batch, batch_none, batch_shared = engine.loop, bf16.loop, shared.loop
    for loop in (batch, batch_none):  # every job computes its whole prompt
        loop.call(lambda loop=loop: setattr(loop.paged.blocks, "prefix_sharing", False))
    modes = {"batched": lambda t: run_batched(batch, t, args.new_tokens),
             "batched_none": lambda t: run_batched(batch_none, t, args.new_tokens),
             "batched_shared": lambda t: run_batched(batch_shared, t, args.new_tokens)}
    if not args.no_sequential:
        modes["sequential"] = lambda t: run_sequential(engine, t, args.new_tokens)
    if not args.no_hf:
        modes["hf_cb"] = lambda t: run_hf_cb(bf16, t, args.new_tokens)
        modes["hf_padded"] = lambda t: run_hf_padded(bf16, t, args.new_tokens)
    stack = contextlib.ExitStack()
    if not args.no_queue:
        from bench.queue_batching import QueueBatchRunner

        runner = stack.enter_context(QueueBatchRunner(model=settings.model, max_batch=max(args.concurrency),
                                                          repetition_penalty=REPETITION_PENALTY,
                                                          quant=args.quant))
        modes["queue"] = lambda t: run_queue(runner, t, args.new_tokens)
    try:
        for name, fn in modes.items():                 # warmup
            if name != "hf_cb":
                fn(prompts(2))
        rows = []
        for index, n in enumerate(args.concurrency):
            if "hf_cb" in modes:
                warm_hf_cb(bf16, n, args.new_tokens)
            runs: dict[str, list[dict]] = {name: [] for name in modes}
            for round_ in range(args.repeats):      # interleaved rounds, each in a rotated order
                names = list(modes)
                shift = (index + round_) % len(names)
                for name in names[shift:] + names[:shift]:
                    runs[name].append(modes[name](prompts(n)))
            measured = {name: median_run(r) for name, r in runs.items()}
            for name in modes:
                m = measured[name]
                rows.append({"concurrency": n, "mode": name, "tokens": m["tokens"],
                             "wall_s": round(m["wall_s"], 3), "tok_per_s": round(m["tok_per_s"], 2),
                             "ttft_p50_s": round(m["ttft_p50_s"], 3),
                             "ttft_p90_s": round(m["ttft_p90_s"], 3)})
            print(f"N={n}: " + ", ".join(f"{k} {v['tok_per_s']:.1f} tok/s" for k, v in measured.items()),
                  flush=True)
    finally:
        stack.close()
    add_ratios(rows)
    for loop in (batch, batch_none, batch_shared):
        loop.close()
    print(machine_line(engine.loaded.dtype), f"model {engine.loaded.name}, default quant {engine.loaded.quant},",
          f"{args.new_tokens} new tokens per job, greedy")
    print_table(rows)
    path = write_csv(Path(args.output), rows)
    write_json(path.with_suffix(".machine.json"), machine_info() | {"model": engine.loaded.name, "args": vars(args)})
    plot(rows, path.with_suffix(".png"))
    print(f"wrote {path}, {path.with_suffix('.png')}")


def median_run(runs: list[dict]) -> dict:
    """The run with the median tokens/s (its wall time and TTFTs go together)."""
    ordered = sorted(runs, key=lambda r: r["tok_per_s"])
    return ordered[(len(ordered) - 1) // 2]


def add_ratios(rows: list[dict]) -> None:
    """x_single_job: against the same mode with the fewest jobs; x_hf_cb / x_hf_padded:
    against transformers' persistent continuous batching / padded generate (bf16) at the
    same concurrency."""
    lowest = min(r["concurrency"] for r in rows)
    for row in rows:
        single = next(r["tok_per_s"] for r in rows
                      if r["mode"] == row["mode"] and r["concurrency"] == lowest)
        row["x_single_job"] = round(row["tok_per_s"] / single, 2)
        for anchor in ("hf_cb", "hf_padded"):
            hf = [r for r in rows if r["mode"] == anchor and r["concurrency"] == row["concurrency"]]
            row[f"x_{anchor}"] = round(row["tok_per_s"] / hf[0]["tok_per_s"], 2) if hf else ""


def plot(rows, path) -> None:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6, 4))
    for mode in dict.fromkeys(r["mode"] for r in rows):
        pts = [(r["concurrency"], r["tok_per_s"]) for r in rows if r["mode"] == mode]
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=mode)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("concurrent jobs")
    ax.set_ylabel("aggregate generated tokens/s")
    ax.set_title("Continuous batching throughput")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    main()
