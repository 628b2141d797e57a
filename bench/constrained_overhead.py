"""What the grammar mask costs while decoding, on the real model: batch 1 and a mixed batch of 8.

    flock /tmp/miniserve-heavy.lock python -m bench.constrained_overhead [--rounds 3] [--tokens 48]

Side by side in one run, interleaved round by round, warmed:

- **batch 1** (``paged``, one request): a free answer vs a ``json_schema`` answer. Figures:
  per-token decode time of each (``1 / decode_tokens_per_s``) and, inside the constrained
  run, the time spent in the grammar (mask + accept, measured by the constraint itself)
  as a share of its decode time;
- **batch 8** (the engine loop, 8 requests held at the loop and released together): 8 free vs 4 constrained
  (2 ``json_schema``, 2 ``tool_choice: required``) + 4 free. Figures: wall time per
  scheduler step, tokens/s over the batch, and the grammar's time as a share of the
  mixed batch's wall time.

The overhead target (issue 14) is the grammar's share: at most 10% of decode time.
Writes ``<out>.csv``, ``<out>.json`` (with machine and command) and ``<out>.png``.
"""
from __future__ import annotations

import argparse
import json
import statistics
import threading
import time
from pathlib import Path
from typing import Any

import torch

from bench.stats import machine_summary, print_table, pyplot, write_csv, write_json
from core import grammar
from core.grammar import ToolSpec
from engine.constrained.matcher import TokenConstraint
from engine.types import GenerationRequest, SamplingParams

# The tools the agent would offer (weather, calculator, search) and a nested order object.
WEATHER = {"type": "object", "properties": {
    "location": {"type": "string", "description": "city and country"},
    "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
    "required": ["location", "unit"], "additionalProperties": False}
CALCULATOR = {"type": "object", "properties": {"expression": {"type": "string"}},
              "required": ["expression"], "additionalProperties": False}
SEARCH = {"type": "object", "properties": {
    "query": {"type": "string"}, "max_results": {"type": "integer", "minimum": 1, "maximum": 50},
    "safe": {"type": "boolean"}}, "required": ["query", "max_results"], "additionalProperties": False}
ORDER = {"type": "object", "properties": {
    "customer": {"type": "object", "properties": {
        "name": {"type": "string"}, "email": {"type": "string"},
        "address": {"type": "object", "properties": {"street": {"type": "string"}, "city": {"type": "string"},
                                                     "zip": {"type": "string", "pattern": "^[0-9]{5}$"}},
                    "required": ["street", "city", "zip"], "additionalProperties": False}},
        "required": ["name", "address"], "additionalProperties": False},
    "items": {"type": "array", "minItems": 1, "items": {"type": "object", "properties": {
        "sku": {"type": "string"}, "quantity": {"type": "integer", "minimum": 1},
        "price": {"type": "number"}}, "required": ["sku", "quantity"], "additionalProperties": False}},
    "priority": {"type": "string", "enum": ["low", "normal", "high"]}},
    "required": ["customer", "items", "priority"], "additionalProperties": False}

JSON_PROMPT = "Create an order for Ada (1 Main St, Paris 75001): two A-1 at 9.5, high priority. Answer in JSON."
TOOL_PROMPT = "What is the weather in Paris in celsius?"
FREE_PROMPTS = ["Explain what a KV cache is.", "Write a haiku about the sea.", "What is 12 * 7?",
                "Name three prime numbers.", "Describe Paris in one sentence.", "What is recursion?",
                "Give a tip for writing tests.", "Why is the sky blue?"]
TOOLS = [ToolSpec("get_weather", WEATHER), ToolSpec("calculator", CALCULATOR), ToolSpec("search", SEARCH)]


class ConstraintLog:
    """Collects every TokenConstraint the engine makes (to read the time it spent)."""

    def __init__(self) -> None:
        self.items: list[TokenConstraint] = []
        original = TokenConstraint.__init__

        def init(constraint: TokenConstraint, *args: Any, **kwargs: Any) -> None:
            original(constraint, *args, **kwargs)
            self.items.append(constraint)

        TokenConstraint.__init__ = init  # type: ignore[method-assign]

    def take(self) -> float:
        total = sum(c.work_s for c in self.items)
        self.items.clear()
        return total


def req(prompt: str, tokens: int, constraint: grammar.Constraint | None = None) -> GenerationRequest:
    return GenerationRequest(messages=[{"role": "user", "content": prompt}], method="paged", constraint=constraint,
                             sampling=SamplingParams(max_new_tokens=tokens))


def batch1(engine: Any, log: ConstraintLog, tokens: int, constrained: bool) -> dict[str, Any]:
    constraint = grammar.json_schema(ORDER) if constrained else None
    result = engine.generate(req(JSON_PROMPT, tokens, constraint))
    decode_s = (result.usage.completion_tokens - 1) / max(result.timings.decode_tokens_per_s, 1e-9)
    grammar_s = log.take()
    return {"mode": "batch1", "variant": "json_schema" if constrained else "free",
            "tokens": result.usage.completion_tokens, "ms_per_token": 1000 / result.timings.decode_tokens_per_s,
            "grammar_share": grammar_s / decode_s if constrained else 0.0,
            "valid": _valid_json(result.text) if constrained and result.finish_reason == "stop" else None}


def batch8(engine: Any, log: ConstraintLog, tokens: int, mixed: bool) -> dict[str, Any]:
    requests = [req(p, tokens) for p in FREE_PROMPTS]
    if mixed:
        requests[:2] = [req(JSON_PROMPT, tokens, grammar.json_schema(ORDER)) for _ in range(2)]
        requests[2:4] = [req(TOOL_PROMPT, tokens, grammar.tool_calls(TOOLS, parallel=False)) for _ in range(2)]
    loop, gate = engine.loop, threading.Event()

    def counters() -> tuple[int, int]:
        stats = loop.paged.stats
        return stats.steps, stats.sampled

    steps_before, sampled_before = loop.call(counters)
    loop.post(gate.wait)  # hold the loop so all 8 join the first step
    handles = [loop.submit(r) for r in requests]
    started = time.perf_counter()
    gate.set()
    results = [h.result() for h in handles]
    wall = time.perf_counter() - started
    steps_after, sampled_after = loop.call(counters)
    steps, sampled = steps_after - steps_before, sampled_after - sampled_before
    grammar_s = log.take()
    return {"mode": "batch8", "variant": "4 constrained + 4 free" if mixed else "8 free", "tokens": sampled,
            "ms_per_step": 1000 * wall / max(steps, 1), "tokens_per_s": sampled / wall,
            "grammar_share": grammar_s / wall,
            "valid": all(_valid_json(r.text) for r in results[:2] if r.finish_reason == "stop") if mixed else None}


def _valid_json(text: str) -> bool:
    try:
        json.loads(text)
        return True
    except ValueError:
        return False


def summarize(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for mode, metric in (("batch1", "ms_per_token"), ("batch8", "ms_per_step")):
        variants = sorted({r["variant"] for r in rows if r["mode"] == mode})
        for variant in variants:
            mine = [r for r in rows if r["mode"] == mode and r["variant"] == variant]
            out.append({"mode": mode, "variant": variant, "rounds": len(mine),
                        f"{metric}_median": statistics.median(r[metric] for r in mine),
                        "grammar_share_median": statistics.median(r["grammar_share"] for r in mine),
                        "all_valid": all(r["valid"] in (None, True) for r in mine)})
    return out


def plot(summary: list[dict[str, Any]], path: Path) -> None:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 3.5))
    labels = [f"{s['mode']}\n{s['variant']}" for s in summary]
    ax.bar(labels, [100 * s["grammar_share_median"] for s in summary], color="tab:orange")
    ax.axhline(10, color="red", linestyle="--", label="target: 10% of decode time")
    ax.set_ylabel("grammar time, % of decode")
    ax.set_title("Grammar mask overhead on the real model (median over rounds)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main() -> None:
    from core.settings import load_settings
    from engine.engine import Engine

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=96)
    parser.add_argument("--out", default="results/constrained_overhead")
    args = parser.parse_args()
    engine = Engine(load_settings()).load()
    log = ConstraintLog()
    batch1(engine, log, 8, True)  # warm: compile the grammars, first forward
    batch1(engine, log, 8, False)
    rows: list[dict[str, Any]] = []
    try:
        for r in range(args.rounds):
            for constrained in ((False, True) if r % 2 == 0 else (True, False)):
                rows.append({"round": r, **batch1(engine, log, args.tokens, constrained)})
            for mixed in ((False, True) if r % 2 == 0 else (True, False)):
                rows.append({"round": r, **batch8(engine, log, args.tokens, mixed)})
            print(json.dumps(rows[-4:], default=str))
    finally:
        engine.close()
    summary = summarize(rows)
    print_table(summary, list(summary[0]) + ["ms_per_step_median"])
    out = Path(args.out)
    write_csv(out.with_suffix(".csv"), rows)
    write_json(out.with_suffix(".json"), {
        "command": f"python -m bench.constrained_overhead --rounds {args.rounds} --tokens {args.tokens}",
        "torch_threads": torch.get_num_threads(), "summary": summary, "machine": machine_summary(), "rows": rows})
    plot(summary, out.with_suffix(".png"))
    print(f"wrote {out}.csv/.json/.png")


if __name__ == "__main__":
    main()
