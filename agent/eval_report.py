"""The agent evaluation's output files: per-case CSV, JSON summary and a per-category chart.

Written both by ``python -m bench.evaluate_agent`` and by the Celery chord's summary task
(``worker/agent_eval_tasks.py``), so it lives with the evaluation, not in ``bench``.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from core.results import write_csv, write_json

METRICS = ("raw_routing", "routing", "tool_result", "end_to_end")


def write_outputs(records: list[dict[str, Any]], summary: dict[str, Any], output: Path) -> dict[str, Path]:
    """CSV (one row per case, trace as JSON), summary JSON and the per-category chart."""
    rows = [{**{k: v for k, v in r.items() if k != "trace"}, "trace": json.dumps(r["trace"], ensure_ascii=False)}
            for r in records]
    paths = {"csv": write_csv(output, rows), "json": write_json(output.with_suffix(".json"), summary)}
    paths["png"] = plot(summary, output.with_suffix(".png"))
    return paths


def plot(summary: dict[str, Any], path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cats = list(summary["categories"]) + ["overall"]
    rows = [summary["categories"][c] for c in cats[:-1]] + [summary["overall"]]
    fig, ax = plt.subplots(figsize=(12, 4.5))
    width = 0.2
    for i, metric in enumerate(METRICS):
        values = [(r[metric] if r[metric] is not None else 0) * 100 for r in rows]
        ax.bar([x + (i - 1.5) * width for x in range(len(cats))], values, width, label=metric)
    ax.set_xticks(range(len(cats)), [f"{c}\n(n={r['cases']})" for c, r in zip(cats, rows)], fontsize=8)
    ax.set_ylabel("% of cases")
    ax.set_ylim(0, 118)
    ax.axhline(95, color="grey", lw=0.5, ls="--")
    ax.set_title(f"Agent evaluation ({summary.get('run', {}).get('model', '')})")
    ax.legend(fontsize=8, ncol=4, loc="upper center")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
