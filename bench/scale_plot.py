"""The PNG of ``python -m bench.scale``: one panel per part that ran."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from bench.stats import pyplot


def plot(rows: list[dict[str, Any]], summary: dict[str, Any], path: Path) -> None:
    plt = pyplot()
    panels = [part for part in ("a", "b", "c") if part in summary]
    if not panels:
        return
    fig, axes = plt.subplots(1, len(panels), figsize=(5.2 * len(panels), 4.2), squeeze=False)
    for ax, part in zip(axes[0], panels):
        {"a": _queue_layer, "b": _routing, "c": _worker_death}[part](ax, [r for r in rows if r["part"] == part],
                                                                    summary[part])
    fig.suptitle(f"MiniServe scale-out ({summary['machine'].get('cpu', '')}, {summary['machine'].get('cpus')} CPUs)",
                 fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _queue_layer(ax, rows, summary) -> None:
    for pinned, color in ((False, "tab:blue"), (True, "tab:orange")):
        label = "pinned, one core each" if pinned else "not pinned (default)"
        runs = [r for r in summary["runs"] if bool(r.get("pinned")) == pinned]
        if not runs:
            continue
        for row in rows:
            if bool(row.get("pinned")) == pinned:
                ax.scatter(row["workers"], row["jobs_per_s"], color=color, s=12, alpha=0.5)
        ax.plot([r["workers"] for r in runs], [r["jobs_per_s_median"] for r in runs], marker="o", color=color,
                label=f"{label}, median")
        for r in runs:
            ax.annotate(f"{r['x_one']}x", (r["workers"], r["jobs_per_s_median"]), textcoords="offset points",
                        xytext=(4, 6), color=color)
    ax.set(title="(a) queue layer, tiny model", xlabel="worker processes", ylabel="jobs/s")
    ax.set_xticks(sorted({r["workers"] for r in summary["runs"]}))
    ax.legend(loc="lower right", fontsize=7)


def _routing(ax, rows, summary) -> None:
    modes = ["off", "on"]
    p50 = [summary[m]["ttft_p50_s"] for m in modes]
    p90 = [summary[m]["ttft_p90_s"] for m in modes]
    x = range(len(modes))
    ax.bar([i - 0.2 for i in x], p50, width=0.4, label="TTFT p50")
    ax.bar([i + 0.2 for i in x], p90, width=0.4, label="TTFT p90")
    for i, mode in enumerate(modes):
        s = summary[mode]
        ax.annotate(f"repeats hit {s['hit_share_repeats']:.0%}\n{s['tokens_per_s']} tok/s", (i, max(p90) * 1.03),
                    ha="center", fontsize=8)
    ax.set_ylim(0, max(p90) * 1.3)
    ax.set_xticks(list(x), [f"routing {m}" for m in modes])
    ax.set(title=f"(b) 2 workers, 4 prompts x {len(rows) // 8} jobs", ylabel="seconds")
    ax.legend(loc="upper center", fontsize=8)


def _worker_death(ax, rows, summary) -> None:
    ordered = sorted(rows, key=lambda r: r["finished_after_kill_s"])
    ax.barh([r["job"] for r in ordered], [r["finished_after_kill_s"] for r in ordered],
            color=["tab:red" if r["attempt"] > 1 else "tab:blue" for r in ordered])
    from matplotlib.patches import Patch

    ax.axvline(summary["budget_s"], color="black", linestyle="--", label=f"lease + 30 s = {summary['budget_s']} s")
    ax.legend(handles=[Patch(color="tab:red", label="running at the kill: re-run (attempt 2)"),
                       Patch(color="tab:blue", label="waiting at the kill: rescued, attempt 1"),
                       *ax.get_legend_handles_labels()[0]], loc="lower right", fontsize=7)
    ax.set(title="(c) worker SIGKILLed: jobs end elsewhere", xlabel="finished, seconds after the kill")
