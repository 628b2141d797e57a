"""Agent evaluation on the real model: ``python -m bench.evaluate_agent``.

Runs the cases in ``data/agent_cases.json`` (optionally ``--category X`` repeated, ``--limit
N``) either in this process with the engine (``--local``, the default) or as one Celery task
per case fanned out as a group on the running workers (``--celery``). Writes the per-case CSV,
the JSON summary next to it and a PNG bar chart per category, and prints the table.
"""
from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any, Callable

from agent.eval_report import write_outputs
from agent.evaluation import CATEGORIES, Case, load_cases, run_case, summarize
from bench.stats import machine_info


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--category", action="append", choices=CATEGORIES, help="repeatable")
    parser.add_argument("--limit", type=int, default=None, help="first N cases (after --category)")
    parser.add_argument("--output", default="results/agent_eval.csv")
    parser.add_argument("--max-steps", type=int, default=3)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--method", default="custom_cache", help="engine generation_method (local mode)")
    parser.add_argument("--no-constrained", dest="constrained", action="store_false",
                        help="tool-call turns without the lazy tool-call grammar (the 'before' of issue 14)")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--local", action="store_true", help="run in this process (default)")
    mode.add_argument("--celery", action="store_true", help="one Celery task per case, as a group")
    parser.add_argument("--timeout", type=float, default=3600, help="seconds to wait for --celery results")
    return parser.parse_args(argv)


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


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
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
