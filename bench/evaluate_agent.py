"""Agent evaluation on the real model: ``python -m bench.evaluate_agent``.

Runs the cases in ``data/agent_cases.json`` (optionally ``--category X`` repeated, ``--limit
N``) either in this process with the engine (``--local``, the default) or as one Celery task
per case fanned out as a group on the running workers (``--celery``). Writes the per-case CSV,
the JSON summary next to it and a PNG bar chart per category, and prints the table.

``--tool-choice`` is the second mode (:mod:`bench.tool_choice`): one ``tool_choice: auto`` turn
per case of ``data/tool_choice_cases.json``, under the name rule and the older brace rule
(``--rule``), counting calls made when none was wanted, calls missed and wrong arguments;
writes ``results/tool_choice.json``::

    python -m bench.evaluate_agent --tool-choice [--rule name --rule brace] [--max-new-tokens 40]
"""
from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any, Callable

from agent.eval_report import write_outputs
from agent.evaluation import CATEGORIES, Case, load_cases, run_case, summarize
from bench.stats import machine_info


AGENT_DEFAULTS = {"output": "results/agent_eval.csv", "max_new_tokens": 128, "method": "custom_cache"}
TOOL_CHOICE_DEFAULTS = {"output": "results/tool_choice.json", "max_new_tokens": 40, "method": "paged"}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--category", action="append", choices=CATEGORIES, help="repeatable")
    parser.add_argument("--limit", type=int, default=None, help="first N cases (after --category)")
    parser.add_argument("--output", default=None, help="default results/agent_eval.csv (--tool-choice: "
                        "results/tool_choice.json)")
    parser.add_argument("--max-steps", type=int, default=3)
    parser.add_argument("--max-new-tokens", type=int, default=None, help="default 128 (--tool-choice: 40, "
                        "enough to decide a call and write its arguments)")
    parser.add_argument("--method", default=None, help="engine generation_method (local mode); default "
                        "custom_cache (--tool-choice: paged, as /v1)")
    parser.add_argument("--no-constrained", dest="constrained", action="store_false",
                        help="tool-call turns without the lazy tool-call grammar (the 'before' of issue 14)")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--local", action="store_true", help="run in this process (default)")
    mode.add_argument("--celery", action="store_true", help="one Celery task per case, as a group")
    parser.add_argument("--timeout", type=float, default=3600, help="seconds to wait for --celery results")
    parser.add_argument("--tool-choice", action="store_true",
                        help="the tool_choice auto mode: data/tool_choice_cases.json under each --rule")
    parser.add_argument("--rule", action="append", choices=("name", "brace"),
                        help="--tool-choice: the call-start rule(s) to run (default both; brace is the old one)")
    parser.add_argument("--batch", type=int, default=8, help="--tool-choice: cases decoded together")
    args = parser.parse_args(argv)
    defaults = TOOL_CHOICE_DEFAULTS if args.tool_choice else AGENT_DEFAULTS
    for name, value in defaults.items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    return args


def run_local(cases: list[Case], args: argparse.Namespace) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    from agent.model import EngineChatModel
    from core.settings import get_settings
    from engine.engine import Engine
    from tools import create_default_registry
    from tqdm import tqdm

    engine = Engine(get_settings()).load()
    model = EngineChatModel(engine, method=args.method, constrained=args.constrained)
    registry = create_default_registry()
    records = []
    for case in tqdm(cases, desc="agent eval", unit="case"):
        records.append(run_case(model, registry, case, args.max_steps, args.max_new_tokens))
    info = engine.info()
    return records, {"mode": "local", "model": info.get("model"), "dtype": info.get("dtype"),
                     "device": info.get("device"), "method": args.method, "constrained": args.constrained}


def run_celery(cases: list[Case], args: argparse.Namespace) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    from tqdm import tqdm

    from worker.agent_eval_tasks import fan_out

    job = fan_out([c.to_dict() for c in cases], args.max_steps, args.max_new_tokens)
    deadline = time.monotonic() + args.timeout
    with tqdm(total=len(cases), desc="agent eval (celery)", unit="case") as bar:
        while not job.ready():
            if time.monotonic() > deadline:
                raise TimeoutError(f"{job.completed_count()}/{len(cases)} cases done after {args.timeout} s")
            bar.update(job.completed_count() - bar.n)
            time.sleep(0.5)
        bar.update(len(cases) - bar.n)
    return list(job.get(timeout=30)), {"mode": "celery", "group_id": job.id}


def format_table(summary: dict[str, Any]) -> str:
    header = f"{'category':<22}{'n':>4}{'raw route':>11}{'routing':>9}{'tool res':>10}{'e2e':>7}{'p50 ms':>9}  failures"
    lines = [header, "-" * len(header)]
    pct = lambda v: "  -" if v is None else f"{v * 100:.0f}%"  # noqa: E731
    for name, r in [*summary["categories"].items(), ("overall", summary["overall"])]:
        fails = ", ".join(f"{k}={v}" for k, v in r["failures"].items())
        lines.append(f"{name:<22}{r['cases']:>4}{pct(r['raw_routing']):>11}{pct(r['routing']):>9}"
                     f"{pct(r['tool_result']):>10}{pct(r['end_to_end']):>7}{r['latency_ms_p50']:>9.0f}  {fails}")
    return "\n".join(lines)


def evaluate(cases: list[Case], args: argparse.Namespace,
             runner: Callable[[list[Case], argparse.Namespace], tuple[list[dict[str, Any]], dict[str, Any]]]
             ) -> dict[str, Any]:
    started = time.perf_counter()
    records, run_info = runner(cases, args)
    summary = summarize(records)
    summary["run"] = {**run_info, "cases": len(records), "categories": args.category or "all",
                      "max_steps": args.max_steps, "max_new_tokens": args.max_new_tokens,
                      "wall_s": round(time.perf_counter() - started, 1), "machine": machine_info()}
    summary["paths"] = {k: str(v) for k, v in write_outputs(records, summary, Path(args.output)).items()}
    return summary


def run_tool_choice(args: argparse.Namespace) -> int:
    from bench import tool_choice
    from bench.stats import write_json
    from core.settings import get_settings
    from engine.engine import Engine

    tools, cases = tool_choice.load()
    cases = cases[:args.limit] if args.limit else cases
    rules = args.rule or list(tool_choice.RULES)
    engine = Engine(get_settings()).load()
    started = time.perf_counter()
    try:
        tool_choice.warm(engine, tools, cases[0], args.method)
        rows = [r for rule in rules for r in tool_choice.run_rule(engine, tools, cases, rule, args.max_new_tokens,
                                                                 args.method, args.batch)]
        info = engine.info()
    finally:
        engine.close()
    summaries = {rule: tool_choice.summarize(r for r in rows if r["rule"] == rule) for rule in rules}
    out = Path(args.output)
    command = "python -m bench.evaluate_agent --tool-choice " + " ".join(f"--rule {r}" for r in rules) + \
        f" --max-new-tokens {args.max_new_tokens} --method {args.method} --batch {args.batch}"
    write_json(out, {"command": command, "model": info.get("model"), "dtype": info.get("dtype"),
                     "wall_s": round(time.perf_counter() - started, 1), "machine": machine_info(),
                     "summary": summaries, "rows": rows})
    print(tool_choice.format_table(summaries))
    print(f"wrote {out}")
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.tool_choice:
        return run_tool_choice(args)
    cases = load_cases(categories=args.category, limit=args.limit)
    summary = evaluate(cases, args, run_celery if args.celery else run_local)
    print(format_table(summary))
    run = summary["run"]
    print(f"\n{run['cases']} cases, {run['wall_s']} s, mode={run['mode']}, model={run.get('model')}, "
          f"dtype={run.get('dtype')}, machine={run['machine']}")
    print("wrote " + ", ".join(summary["paths"].values()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
