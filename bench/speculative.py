"""``python -m bench.speculative``: prompt-lookup speculative decoding on and off, side by side.

On the prompt set ``data/speculative_prompts.json`` (half copy-heavy, half with nothing to
copy; English and Chinese), for each quantization mode:

* batch 1: each prompt alone through the paged scheduler (the default generation method),
  speculation off and on back to back, the order alternating from prompt to prompt;
  decode tokens/s from the result's timings, greedy agreement token for token;
* batch of 8 mixed jobs: 4 copy-heavy + 4 nothing-to-copy prompts submitted together,
  aggregate completion tokens/s over the wall time, off and on interleaved.

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

from bench.paged_common import machine, print_table, pyplot
from bench.stats import cpu_model, read_bandwidth_gbs, write_csv, write_json
from core.settings import load_settings
from engine.batching.service import PagedService
from engine.engine import Engine
from engine.handwritten import forward_for
from engine.run import GenerationRun
from engine.types import GenerationRequest, GenerationResult, SamplingParams

PROMPTS = Path("data/speculative_prompts.json")
RESULTS = Path("results")
TARGETS = {"copy_batch1_x": 2.0, "none_batch1_x": 0.95, "batch8_x": 1.3}




class Runner:
    """One engine (one quantization mode) and a paged service of its own, driven in-process."""

    def __init__(self, model: str, quant: str, dtype: str, spec_tokens: int, spec_ngram: str) -> None:
        self.settings = load_settings(model=model, device="cpu", dtype=dtype, quant=quant,
                                      spec_tokens=spec_tokens, spec_ngram=spec_ngram, max_batch=8)
        self.engine = Engine(self.settings)
        self.loaded = self.engine.loaded
        # no prefix sharing: a repeated prompt must not find its blocks from the previous run
        self.service = PagedService(forward_for(self.engine), self.settings, prefix_sharing=False)

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
            self.service.add(seq)
        while not all(seq.finished for seq in seqs):
            self.service.step()
        wall = time.perf_counter() - start
        for seq in seqs:
            if seq.error is not None:
                raise seq.error
        return [seq.run.result(prompt_tokens=len(seq.prompt_ids)) for seq in seqs], wall


def run_stream(runner: Runner, texts: list[str], speculative: bool, new_tokens: int,
               slots: int = 8) -> tuple[int, float]:
    """``texts`` as a stream of jobs with ``slots`` in flight (a new one joins as soon as one
    ends): (completion tokens, wall seconds). Unlike a fixed batch, whose wall time is its
    longest job, this is what a serving worker's throughput sees."""
    pending = list(texts)
    active: list[Any] = []
    tokens = 0
    start = time.perf_counter()
    while pending or active:
        while pending and len(active) < slots:
            seq = runner.sequence(pending.pop(0), speculative, new_tokens)
            runner.service.add(seq)
            active.append(seq)
        runner.service.step()
        for seq in [s for s in active if s.finished]:
            if seq.error is not None:
                raise seq.error
            tokens += seq.run.produced
            active.remove(seq)
    return tokens, time.perf_counter() - start


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
              rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    per_prompt = []
    for index, prompt in enumerate(prompts):
        order = (False, True) if index % 2 == 0 else (True, False)
        results = {}
        for speculative in order:
            (result,), wall = runner.run([prompt["prompt"]], speculative, new_tokens)
            results[speculative] = result
            rows.append(_row(quant, "batch1", prompt, speculative, result, wall))
        off, on = results[False], results[True]
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


def batch_eight(runner: Runner, quant: str, prompts: list[dict[str, Any]], new_tokens: int, rounds: int,
                rows: list[dict[str, Any]]) -> dict[str, Any]:
    mixed = [p for p in prompts if p["kind"] == "copy"][:4] + [p for p in prompts if p["kind"] == "none"][:4]
    texts = [p["prompt"] for p in mixed]
    rates: dict[bool, list[float]] = {False: [], True: []}
    agree = []
    for r in range(rounds):
        outs = {}
        for speculative in ((False, True) if r % 2 == 0 else (True, False)):
            results, wall = runner.run(texts, speculative, new_tokens)
            tokens = sum(res.usage.completion_tokens for res in results)
            rates[speculative].append(tokens / wall)
            outs[speculative] = results
            for prompt, res in zip(mixed, results):
                rows.append(_row(quant, "batch8", prompt, speculative, res, wall))
            print(f"  [{quant}] batch of 8, speculative={speculative}: {tokens / wall:.2f} tok/s "
                  f"({tokens} tokens in {wall:.1f}s)", flush=True)
        agree.append(sum(a.token_ids == b.token_ids for a, b in zip(outs[False], outs[True])))
    off, on = statistics.median(rates[False]), statistics.median(rates[True])
    stream: dict[bool, float] = {}
    for speculative in (False, True):      # 16 jobs (the 8 twice), 8 in flight
        tokens, wall = run_stream(runner, texts * 2, speculative, new_tokens)
        stream[speculative] = tokens / wall
        print(f"  [{quant}] stream of 16, 8 in flight, speculative={speculative}: {tokens / wall:.2f} tok/s "
              f"({tokens} tokens in {wall:.1f}s)", flush=True)
    return {"quant": quant, "off_tok_s": round(off, 2), "on_tok_s": round(on, 2), "x": round(on / off, 3),
            "rounds": rounds, "jobs": len(texts), "identical": f"{min(agree)}/{len(texts)}",
            "stream_off_tok_s": round(stream[False], 2), "stream_on_tok_s": round(stream[True], 2),
            "stream_x": round(stream[True] / stream[False], 3)}


def summarize(per_prompt: list[dict[str, Any]], batch8: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for quant in sorted({p["quant"] for p in per_prompt}):
        rows = [p for p in per_prompt if p["quant"] == quant]
        copy = [p["x"] for p in rows if p["kind"] == "copy"]
        none = [p["x"] for p in rows if p["kind"] == "none"]
        b8 = next((b for b in batch8 if b["quant"] == quant), None)
        out[quant] = {
            "copy_batch1_x_median": round(statistics.median(copy), 3),
            "none_batch1_x_median": round(statistics.median(none), 3),
            "none_batch1_x_min": round(min(none), 3),
            "batch8_x": b8["x"] if b8 else None,
            "batch8_stream_x": b8["stream_x"] if b8 else None,
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
    ax.bar([b["quant"] for b in batch8], [b["x"] for b in batch8], color="tab:blue")
    ax.axhline(TARGETS["batch8_x"], color="tab:blue", ls="--", lw=0.8)
    ax.axhline(1.0, color="black", lw=0.8)
    ax.set_title("batch of 8 mixed: aggregate x")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quant", default=None,
                        help="comma list of quantization modes (default: MINISERVE_QUANT's default and none)")
    parser.add_argument("--model", default="default", help="MINISERVE_MODEL (a tiny model folder for a smoke run)")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--new-tokens", type=int, default=64, help="max new tokens per batch-1 job")
    parser.add_argument("--batch-new-tokens", type=int, default=192,
                        help="max new tokens per job of the batch of 8 (room for the copy jobs' natural length)")
    parser.add_argument("--batch-rounds", type=int, default=1)
    parser.add_argument("--spec-tokens", type=int, default=None)
    parser.add_argument("--spec-ngram", default=None)
    parser.add_argument("--prompts", default=str(PROMPTS))
    parser.add_argument("--limit", type=int, default=0, help="first N prompts of each kind (0: all)")
    parser.add_argument("--out", default=str(RESULTS / "speculative"))
    args = parser.parse_args(argv)
    defaults = load_settings()
    quants = args.quant.split(",") if args.quant else list(dict.fromkeys([defaults.quant, "none"]))
    spec_tokens = args.spec_tokens or defaults.spec_tokens
    spec_ngram = args.spec_ngram or ",".join(map(str, defaults.spec_ngram))
    prompts = json.loads(Path(args.prompts).read_text())["prompts"]
    if args.limit:
        prompts = [p for kind in ("copy", "none") for p in [q for q in prompts if q["kind"] == kind][:args.limit]]
    info = {**machine(), "cpu_model": cpu_model(), "read_bandwidth_gbs": round(read_bandwidth_gbs(), 1),
            "command": "python -m bench.speculative " + " ".join(argv if argv is not None else sys.argv[1:]),
            "dtype": args.dtype, "new_tokens": args.new_tokens, "batch_new_tokens": args.batch_new_tokens, "spec_tokens": spec_tokens, "spec_ngram": spec_ngram,
            "prompts": len(prompts)}
    print(f"machine: {info['cpu_model']}, {info['cpu_cores']} cores, read {info['read_bandwidth_gbs']} GB/s; "
          f"k={spec_tokens}, ngram={spec_ngram}, {args.new_tokens} new tokens", flush=True)
    rows: list[dict[str, Any]] = []
    per_prompt: list[dict[str, Any]] = []
    batch8: list[dict[str, Any]] = []
    for quant in quants:
        runner = Runner(args.model, quant, args.dtype, spec_tokens, spec_ngram)
        info["torch_threads"] = torch.get_num_threads()          # MINISERVE_THREADS applies at load
        runner.run([prompts[0]["prompt"]], True, 8)                      # warm-up
        runner.run([prompts[0]["prompt"]], False, 8)
        per_prompt += batch_one(runner, quant, prompts, args.new_tokens, rows)
        batch8.append(batch_eight(runner, quant, prompts, args.batch_new_tokens, args.batch_rounds, rows))
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
