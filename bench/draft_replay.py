"""``python -m bench.draft_replay``: how many verify steps the drafter needs for real answers.

Why: speculation's gain at batch 1 is the tokens each verify step yields; that depends on the
drafter alone once the answer is fixed. This generates each copy-heavy prompt's greedy answer of
``data/speculative_prompts.json`` with speculation off (the default model and quantization,
``--new-tokens`` tokens), then replays the answer through the drafter as the engine uses it
(k = ``--spec-tokens``, lengths ``--spec-ngram``, the layout map of the tokenizer): each step
proposes k drafts after the answer so far, the longest agreeing run is accepted plus one token
(the correction or the bonus), as greedy verification would. It counts steps, drafts and
accepted drafts for the drafter with ``follow`` (continued copies, restyled layout,
engine.speculative.restyle) and without (the drafter before it), side by side. No timing: the
figures are exact for the answers generated here.

Writes ``<out>/draft_replay.json`` and ``.png``.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from bench.paged_common import machine, print_table, pyplot
from bench.speculative import PROMPTS, Runner
from bench.stats import cpu_model, write_json
from core.settings import load_settings
from engine.speculative.layout import layout_map
from engine.speculative.ngram import NgramDrafter

VARIANTS = {"follow": True, "before": False}


def replay(prompt_ids: list[int], answer: list[int], layout: Any, lengths: tuple[int, ...], k: int,
           follow: bool) -> dict[str, int]:
    """Greedy verification of ``answer`` with this drafter: steps, drafts, accepted drafts."""
    drafter = NgramDrafter(prompt_ids, lengths, k, layout, follow=follow)
    at = steps = drafted = accepted = 0
    while at < len(answer):
        drafts = drafter.propose(min(k, len(answer) - at - 1))
        run = 0
        while run < len(drafts) and drafts[run] == answer[at + run]:
            run += 1
        drafter.extend(answer[at:at + run + 1])
        at, steps, drafted, accepted = at + run + 1, steps + 1, drafted + len(drafts), accepted + run
    return {"tokens": len(answer), "steps": steps, "drafted": drafted, "accepted": accepted}


def answers(runner: Runner, prompts: list[dict[str, Any]], new_tokens: int) -> dict[str, tuple[list[int], list[int]]]:
    """Each prompt's (prompt ids, greedy answer ids), speculation off, through the paged service."""
    out = {}
    for prompt in prompts:
        seq = runner.sequence(prompt["prompt"], False, new_tokens)
        runner.service.add(seq)
        while not seq.finished:
            runner.service.step()
        if seq.error is not None:
            raise seq.error
        out[prompt["id"]] = (list(seq.prompt_ids), list(seq.run.token_ids))
    return out


def plot(rows: list[dict[str, Any]], path: Path) -> None:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(8, 4))
    names = [r["prompt"] for r in rows if r["variant"] == "before"]
    width = 0.38
    for offset, variant in ((-width / 2, "before"), (width / 2, "follow")):
        values = [r["tokens_per_step"] for r in rows if r["variant"] == variant]
        ax.bar([i + offset for i in range(len(names))], values, width, label=variant)
    ax.set_xticks(range(len(names)), names, rotation=30, ha="right")
    ax.set_ylabel("tokens per verify step (greedy replay)")
    ax.set_title("Drafter replay over the copy-heavy prompts' answers")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None)
    parser.add_argument("--quant", default="auto")
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--spec-tokens", type=int, default=8)
    parser.add_argument("--spec-ngram", default="4,3,2")
    parser.add_argument("--kind", default="copy", help="prompt kind replayed (copy, none, all)")
    parser.add_argument("--out", default="results")
    args = parser.parse_args(argv)
    runner = Runner(args.model or load_settings().model, args.quant, "bfloat16", args.spec_tokens, args.spec_ngram)
    prompts = [p for p in json.loads(PROMPTS.read_text())["prompts"] if args.kind in ("all", p["kind"])]
    generated = answers(runner, prompts, args.new_tokens)
    layout = layout_map(runner.loaded.tokenizer)
    lengths = tuple(int(n) for n in args.spec_ngram.split(","))
    rows = []
    for prompt in prompts:
        prompt_ids, answer = generated[prompt["id"]]
        for variant, follow in VARIANTS.items():
            counts = replay(prompt_ids, answer, layout, lengths, args.spec_tokens, follow)
            rows.append({"prompt": prompt["id"], "variant": variant, **counts,
                         "tokens_per_step": round(counts["tokens"] / counts["steps"], 3),
                         "acceptance": round(counts["accepted"] / max(counts["drafted"], 1), 3)})
    runner.engine.close()
    print_table(rows)
    out = Path(args.out)
    command = "python -m bench.draft_replay " + " ".join(sys.argv[1:] if argv is None else argv)
    write_json(out / "draft_replay.json", {"machine": {**machine(), "cpu_model": cpu_model(), "command": command,
                                                       "quant": runner.settings.quant},
                                           "args": vars(args), "rows": rows})
    plot(rows, out / "draft_replay.png")
    print(f"wrote {out / 'draft_replay.json'} and {out / 'draft_replay.png'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
