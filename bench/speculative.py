"""``python -m bench.speculative``: prompt-lookup speculative decoding on and off, side by side.

On the prompt set ``data/speculative_prompts.json`` (half copy-heavy, half with nothing to
copy; English and Chinese), for each quantization mode:

* batch 1: each prompt alone through the paged scheduler (the default generation method),
  speculation off and on back to back, ``--batch1-repeats`` times (3; the order alternating),
  each side's median run; decode tokens/s from the result's timings, greedy agreement token
  for token;
* a serving batch of 8: a closed loop of 8 slots fed from a queue of 24 jobs (copy-heavy and
  nothing-to-copy alternating, the same list and order on and off; a new job takes a slot as
  soon as one ends), aggregate completion tokens/s from the first submission to the last
  job's end; off and on interleaved over several rounds, median ratio. This is the batch-of-8
  target's figure;
* also 8 jobs (4 copy-heavy + 4 nothing-to-copy) started together and timed until all end
  (a fixed batch: its wall time is its longest job), same rounds.

Writes ``results/speculative.csv`` (one row per run), ``results/speculative.json``
(summary, targets, machine, command) and ``results/speculative.png``.
Run it under the shared lock: ``flock /tmp/miniserve-heavy.lock .venv/bin/python -m bench.speculative``.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

from bench.stats import RESULTS, machine_summary, print_table, pyplot, write_csv, write_json
from core.settings import load_settings
from engine.batching import Scheduler
from engine.engine import Engine
from engine.handwritten import forward_for
from engine.quant.plan import resolve_quant
from engine.run import GenerationRun
from engine.types import GenerationRequest, GenerationResult, SamplingParams

PROMPTS = Path("data/speculative_prompts.json")
TARGETS = {"copy_batch1_x": 2.0, "none_batch1_x": 0.95, "batch8_x": 1.3}




class Runner:
    """One engine (one quantization mode) and a paged service of its own, driven in-process."""

    def __init__(self, model: str, quant: str, dtype: str, spec_tokens: int, spec_ngram: str) -> None:
        self.settings = load_settings(model=model, device="cpu", dtype=dtype, quant=quant,
                                      spec_tokens=spec_tokens, spec_ngram=spec_ngram, max_batch=8)
        self.engine = Engine(self.settings)
        self.loaded = self.engine.loaded
        # no prefix sharing: a repeated prompt must not find its blocks from the previous run
        self.service = Scheduler.for_model(forward_for(self.engine), self.settings, prefix_sharing=False)

    def sequence(self, text: str, speculative: bool, new_tokens: int) -> Any:
        request = GenerationRequest(messages=[{"role": "user", "content": text}], method="paged",
                                    sampling=SamplingParams(max_new_tokens=new_tokens), speculative=speculative)
        prompt = self.engine.prompt(request)
        run = GenerationRun(self.loaded.tokenizer, method="paged", max_new_tokens=new_tokens,
                            eos_ids=self.loaded.eos_ids)
        return self.service.new_sequence(prompt.ids, run, request.sampling,
                                         self.loaded.default_repetition_penalty, speculative=speculative)

    def run(self, texts: list[str], speculative: bool, new_tokens: int) -> tuple[list[GenerationResult], float]:
        """All ``texts`` submitted together; (results, wall seconds)."""
        seqs = [self.sequence(text, speculative, new_tokens) for text in texts]
        start = time.perf_counter()
        for seq in seqs:
            self.service.submit(seq)
        while not all(seq.finished for seq in seqs):
            self.service.step()
        wall = time.perf_counter() - start
        for seq in seqs:
            if seq.error is not None:
                raise seq.error
        return [seq.run.result(prompt_tokens=len(seq.prompt_ids)) for seq in seqs], wall


def closed_loop(runner: Runner, texts: list[str], speculative: bool, new_tokens: int,
                slots: int = 8) -> tuple[list[GenerationResult], float]:
    """A serving batch: ``texts`` are a queue of jobs, ``slots`` of them in flight, a new one
    joining as soon as one ends (in queue order). (results in queue order, wall seconds from
    the first submission to the last job's end, the tail with fewer jobs included)."""
    pending = list(enumerate(texts))
    active: list[tuple[int, Any]] = []
    results: list[GenerationResult | None] = [None] * len(texts)
    start = time.perf_counter()
    while pending or active:
        while pending and len(active) < slots:
            index, text = pending.pop(0)
            seq = runner.sequence(text, speculative, new_tokens)
            runner.service.submit(seq)
            active.append((index, seq))
        runner.service.step()
        for index, seq in [a for a in active if a[1].finished]:
            if seq.error is not None:
                raise seq.error
            results[index] = seq.run.result(prompt_tokens=len(seq.prompt_ids))
            active.remove((index, seq))
    return [r for r in results if r is not None], time.perf_counter() - start


def _row(quant: str, mode: str, prompt: dict[str, Any], speculative: bool, result: GenerationResult,
         wall: float) -> dict[str, Any]:
    usage = result.usage
    return {"quant": quant, "mode": mode, "prompt": prompt.get("id", "batch"), "kind": prompt.get("kind", "mixed"),
            "lang": prompt.get("lang", ""), "speculative": speculative,
            "completion_tokens": usage.completion_tokens, "draft_tokens": usage.draft_tokens,
            "accepted_draft_tokens": usage.accepted_draft_tokens,
            "decode_tok_s": round(result.timings.decode_tokens_per_s, 3), "wall_s": round(wall, 3),
            "ttft_s": round(result.timings.ttft_s, 4)}


def batch_one(runner: Runner, quant: str, prompts: list[dict[str, Any]], new_tokens: int,
              rows: list[dict[str, Any]], repeats: int = 1) -> list[dict[str, Any]]:
    """Each prompt off and on, ``repeats`` interleaved times (alternating order); each side's
    median run by decode tokens/s (one run per side let a disturbed moment of a shared machine
    turn a 1.7x prompt into 0.87x)."""
    per_prompt = []
    for index, prompt in enumerate(prompts):
        runs: dict[bool, list[GenerationResult]] = {False: [], True: []}
        for repeat in range(repeats):
            order = (False, True) if (index + repeat) % 2 == 0 else (True, False)
            for speculative in order:
                (result,), wall = runner.run([prompt["prompt"]], speculative, new_tokens)
                runs[speculative].append(result)
                rows.append(_row(quant, "batch1", prompt, speculative, result, wall))
        off, on = (_median_result(runs[side]) for side in (False, True))
        same = on.token_ids == off.token_ids
        diverge = next((i for i, (a, b) in enumerate(zip(on.token_ids, off.token_ids)) if a != b),
                       None if same else min(len(on.token_ids), len(off.token_ids)))
        speedup = on.timings.decode_tokens_per_s / off.timings.decode_tokens_per_s
        accept = on.usage.accepted_draft_tokens / on.usage.draft_tokens if on.usage.draft_tokens else 0.0
        per_prompt.append({"quant": quant, "prompt": prompt["id"], "kind": prompt["kind"], "lang": prompt["lang"],
                           "off_tok_s": round(off.timings.decode_tokens_per_s, 2),
                           "on_tok_s": round(on.timings.decode_tokens_per_s, 2), "x": round(speedup, 3),
                           "acceptance": round(accept, 3), "identical": same, "first_divergence": diverge,
                           "tokens": len(off.token_ids)})
        print(f"  [{quant}] {prompt['id']:<18} off {off.timings.decode_tokens_per_s:6.2f} tok/s  "
              f"on {on.timings.decode_tokens_per_s:6.2f} tok/s  x{speedup:.2f}  accept {accept:.2f}  "
              f"identical={same}", flush=True)
    return per_prompt


def _median_result(results: list[GenerationResult]) -> GenerationResult:
    ordered = sorted(results, key=lambda r: r.timings.decode_tokens_per_s)
    return ordered[(len(ordered) - 1) // 2]


def serving_queue(prompts: list[dict[str, Any]], jobs: int) -> list[dict[str, Any]]:
    """``jobs`` jobs alternating copy-heavy and nothing-to-copy, each kind cycling through
    its prompts: the same list and order for speculation on and off."""
    kinds = [[p for p in prompts if p["kind"] == kind] for kind in ("copy", "none")]
    return [kinds[i % 2][(i // 2) % len(kinds[i % 2])] for i in range(jobs)]


def _measure(runner: Runner, label: str, quant: str, mode: str, jobs: list[dict[str, Any]], speculative: bool,
             new_tokens: int, rows: list[dict[str, Any]]) -> tuple[float, list[GenerationResult]]:
    texts = [p["prompt"] for p in jobs]
    if mode == "batch8":
        results, wall = runner.run(texts, speculative, new_tokens)
    else:
        results, wall = closed_loop(runner, texts, speculative, new_tokens)
    tokens = sum(res.usage.completion_tokens for res in results)
    for prompt, res in zip(jobs, results):
        rows.append(_row(quant, mode, prompt, speculative, res, wall))
    drafted = sum(res.usage.draft_tokens for res in results)
    accepted = sum(res.usage.accepted_draft_tokens for res in results)
    print(f"  [{quant}] {label}, speculative={speculative}: {tokens / wall:.2f} tok/s "
          f"({tokens} tokens in {wall:.1f}s, drafts {accepted}/{drafted} accepted)", flush=True)
    return tokens / wall, results


def batched(runner: Runner, quant: str, prompts: list[dict[str, Any]], new_tokens: int, rounds: int,
            together_rounds: int, queue_jobs: int, rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Two batched measurements, off and on interleaved (order alternating by round), medians:
    ``serving``: a closed loop of 8 slots fed from a queue of ``queue_jobs`` mixed jobs;
    ``batch8``: 4 copy-heavy + 4 nothing-to-copy jobs started together, timed until all end."""
    setups = {"serving": (f"closed loop, 8 slots, queue of {queue_jobs}", serving_queue(prompts, queue_jobs)),
              "batch8": ("8 started together", [p for p in prompts if p["kind"] == "copy"][:4]
                         + [p for p in prompts if p["kind"] == "none"][:4])}
    out: dict[str, Any] = {"quant": quant, "rounds": rounds, "batch8_rounds": together_rounds}
    for mode, (label, jobs) in setups.items():
        rates: dict[bool, list[float]] = {False: [], True: []}
        agree = []
        for r in range(rounds if mode == "serving" else together_rounds):
            outs = {}
            for speculative in ((False, True) if r % 2 == 0 else (True, False)):
                rate, outs[speculative] = _measure(runner, label, quant, mode, jobs, speculative, new_tokens, rows)
                rates[speculative].append(rate)
            agree.append(sum(a.token_ids == b.token_ids for a, b in zip(outs[False], outs[True])))
        off, on = statistics.median(rates[False]), statistics.median(rates[True])
        paired = [b / a for a, b in zip(rates[False], rates[True])]       # on / off within a round
        prefix = "" if mode == "serving" else "batch8_"
        out.update({f"{prefix}off_tok_s": round(off, 2), f"{prefix}on_tok_s": round(on, 2),
                    f"{prefix}x": round(statistics.median(paired), 3), f"{prefix}jobs": len(jobs),
                    f"{prefix}x_rounds": [round(x, 3) for x in paired],
                    f"{prefix}identical": f"{min(agree)}/{len(jobs)}"})
    return out


def summarize(per_prompt: list[dict[str, Any]], batch8: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for quant in sorted({p["quant"] for p in per_prompt}):
        rows = [p for p in per_prompt if p["quant"] == quant]
        copy = [p["x"] for p in rows if p["kind"] == "copy"]
        none = [p["x"] for p in rows if p["kind"] == "none"]
        b8 = next((b for b in batch8 if b["quant"] == quant), None)   # "x": the serving closed loop
        out[quant] = {
            "copy_batch1_x_median": round(statistics.median(copy), 3),
            "none_batch1_x_median": round(statistics.median(none), 3),
            "none_batch1_x_min": round(min(none), 3),
            "batch8_x": b8["x"] if b8 else None,
            "batch8_started_together_x": b8["batch8_x"] if b8 else None,
            "greedy_identical": f"{sum(p['identical'] for p in rows)}/{len(rows)}",
            "targets_met": {
                "copy_batch1_x": statistics.median(copy) >= TARGETS["copy_batch1_x"],
                "none_batch1_x": statistics.median(none) >= TARGETS["none_batch1_x"],
                "batch8_x": bool(b8 and b8["x"] >= TARGETS["batch8_x"])}}
    return out


def plot(per_prompt: list[dict[str, Any]], batch8: list[dict[str, Any]], path: Path) -> None:
    plt = pyplot()
    quants = sorted({p["quant"] for p in per_prompt})
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.8), gridspec_kw={"width_ratios": [4, 1]})
    ax = axes[0]
    names = [p["prompt"] for p in per_prompt if p["quant"] == quants[0]]
    width = 0.8 / len(quants)
    for qi, quant in enumerate(quants):
        rows = {p["prompt"]: p for p in per_prompt if p["quant"] == quant}
        xs = [i + qi * width for i in range(len(names))]
        colors = ["tab:green" if rows[n]["kind"] == "copy" else "tab:gray" for n in names]
        ax.bar(xs, [rows[n]["x"] for n in names], width, color=colors, alpha=1.0 - 0.35 * qi,
               label=f"quant={quant}")
    ax.axhline(1.0, color="black", lw=0.8)
    ax.axhline(TARGETS["copy_batch1_x"], color="tab:green", ls="--", lw=0.8, label="copy target 2x")
    ax.axhline(TARGETS["none_batch1_x"], color="tab:red", ls="--", lw=0.8, label="no-copy floor 0.95x")
    ax.set_xticks([i + width * (len(quants) - 1) / 2 for i in range(len(names))], names, rotation=40, ha="right")
    ax.set_ylabel("decode tok/s, speculation on / off")
    ax.set_title("batch 1 (green: copy-heavy, gray: nothing to copy)")
    ax.legend(fontsize=8)
    ax = axes[1]
    labels = [f"{b['quant']}\nserving" for b in batch8] + [f"{b['quant']}\n8 together" for b in batch8]
    ax.bar(labels, [b["x"] for b in batch8] + [b["batch8_x"] for b in batch8],
           color=["tab:blue"] * len(batch8) + ["tab:gray"] * len(batch8))
    ax.axhline(TARGETS["batch8_x"], color="tab:blue", ls="--", lw=0.8)
    ax.axhline(1.0, color="black", lw=0.8)
    ax.set_title("8 mixed jobs: aggregate tok/s x")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quant", default=None,
                        help="comma list of quantization modes (default: MINISERVE_QUANT's default and none)")
    parser.add_argument("--model", default="default", help="MINISERVE_MODEL (a tiny model folder for a smoke run)")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--new-tokens", type=int, default=128, help="max new tokens per batch-1 job")
    parser.add_argument("--batch-new-tokens", type=int, default=192,
                        help="max new tokens per job of the batch of 8 (room for the copy jobs' natural length)")
    parser.add_argument("--batch1-repeats", type=int, default=3,
                        help="interleaved off/on runs of each batch-1 prompt (median reported)")
    parser.add_argument("--batch-rounds", type=int, default=3, help="interleaved off/on rounds of the serving loop")
    parser.add_argument("--together-rounds", type=int, default=1, help="rounds of the 8-started-together batch")
    parser.add_argument("--queue-jobs", type=int, default=24, help="jobs in the serving closed loop's queue")
    parser.add_argument("--spec-tokens", type=int, default=None)
    parser.add_argument("--spec-ngram", default=None)
    parser.add_argument("--prompts", default=str(PROMPTS))
    parser.add_argument("--limit", type=int, default=0, help="first N prompts of each kind (0: all)")
    parser.add_argument("--out", default=str(RESULTS / "speculative"))
    args = parser.parse_args(argv)
    defaults = load_settings()
    # the default setting and none; when the default resolves to none here, one run covers both
    quants = args.quant.split(",") if args.quant else list(dict.fromkeys([resolve_quant(defaults.quant, "cpu"), "none"]))
    spec_tokens = args.spec_tokens or defaults.spec_tokens
    spec_ngram = args.spec_ngram or ",".join(map(str, defaults.spec_ngram))
    prompts = json.loads(Path(args.prompts).read_text())["prompts"]
    if args.limit:
        prompts = [p for kind in ("copy", "none") for p in [q for q in prompts if q["kind"] == kind][:args.limit]]
    info = {**machine_summary(),
            "command": "python -m bench.speculative " + " ".join(argv if argv is not None else sys.argv[1:]),
            "dtype": args.dtype, "new_tokens": args.new_tokens, "batch_new_tokens": args.batch_new_tokens,
            "queue_jobs": args.queue_jobs, "spec_tokens": spec_tokens, "spec_ngram": spec_ngram,
            "prompts": len(prompts), "default_quant": defaults.quant,
            "default_quant_resolves_to": resolve_quant(defaults.quant, "cpu")}
    print(f"machine: {info['cpu_model']}, {info['cpus']} cores, read {info['read_bandwidth_gbs']:.1f} GB/s; "
          f"k={spec_tokens}, ngram={spec_ngram}, {args.new_tokens} new tokens", flush=True)
    rows: list[dict[str, Any]] = []
    per_prompt: list[dict[str, Any]] = []
    batch8: list[dict[str, Any]] = []
    for quant in quants:
        runner = Runner(args.model, quant, args.dtype, spec_tokens, spec_ngram)
        info["torch_threads"] = torch.get_num_threads()          # MINISERVE_THREADS applies at load
        runner.run([prompts[0]["prompt"]], True, 8)                      # warm-up
        runner.run([prompts[0]["prompt"]], False, 8)
        per_prompt += batch_one(runner, quant, prompts, args.new_tokens, rows, args.batch1_repeats)
        batch8.append(batched(runner, quant, prompts, args.batch_new_tokens, args.batch_rounds, args.together_rounds,
                              args.queue_jobs, rows))
    summary = summarize(per_prompt, batch8)
    out = Path(args.out)
    write_csv(out.with_suffix(".csv"), rows)
    write_json(out.with_suffix(".json"), {"machine": info, "targets": TARGETS, "summary": summary,
                                          "batch1": per_prompt, "batch8": batch8})
    plot(per_prompt, batch8, out.with_suffix(".png"))
    print_table(per_prompt)
    print_table(batch8)
    print(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
