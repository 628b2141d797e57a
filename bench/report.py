"""Write docs/benchmarks.md and the README's figures block from the results files.

The page is generated so that no figure drifts by hand: each section reads the files one
benchmark writes under results/ (JSON where it writes JSON, its CSV otherwise), and says the
question, the command, the machine, a table of headline figures and the plot. The output
depends only on those files (no time of generation), so a test can compare the committed
page with a fresh one.

    python -m bench.report            # rewrite docs/benchmarks.md and the README block
    python -m bench.report --check    # exit 1 if either differs from what it would write
"""
from __future__ import annotations

import argparse
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from bench.report_engine import (read_batching, read_compare_generation, read_constrained, read_fairness,
                                 read_models, read_paged_generation, read_prefix_cache,
                                 read_quantization, read_speculative)
from bench.report_figures import Figures, clean_command, machine_kind, machine_line, table
from bench.report_sizes import OTHER_HOSTS, SIZES
from bench.report_service import (BATCH_API, CONNECTIONS, SERVED, TOOL_CHOICE, read_agent, read_embeddings,
                                  read_load, read_queue_overhead, read_scale, read_soak)

ROOT = Path(__file__).resolve().parent.parent
PAGE = Path("docs/benchmarks.md")
README = Path("README.md")
START, END = "<!-- figures:start -->", "<!-- figures:end -->"


@dataclass(frozen=True)
class Section:
    name: str
    title: str
    question: str
    command: str
    files: tuple[str, ...]  # the first one must exist, or the section says "not run yet"
    read: Callable[[Path], Figures]
    pngs: tuple[str, ...] = ()


SECTIONS: tuple[Section, ...] = (
    Section("compare_generation", "Generation methods side by side",
            "How fast is each generation method, and does it produce the same tokens as transformers' `generate`?",
            "python -m bench.compare_generation",
            ("results/compare_generation_bfloat16.summary.csv", "results/compare_generation_bfloat16.machine.json",
             "results/compare_generation_float32.summary.csv", "results/compare_generation_float32.machine.json"),
            read_compare_generation, ("results/compare_generation_bfloat16.png", "results/compare_generation_float32.png")),
    Section("batching", "Continuous batching",
            "How much throughput do concurrent jobs gain from one batched engine, against one at a time and transformers?",
            "python -m bench.batching", ("results/batching.csv",), read_batching, ("results/batching.png",)),
    Section("prefix_cache", "Prefix cache",
            "How much sooner does a prompt start answering when its prefix is cached?",
            "python -m bench.prefix_cache", ("results/prefix_cache.summary.csv", "results/prefix_cache.machine.json"), read_prefix_cache,
            ("results/prefix_cache.png",)),
    Section("paged_generation", "Paged KV cache",
            "What does the paged cache cost in decode speed, and how much KV memory does prefix sharing save?",
            "python -m bench.paged_generation",
            ("results/paged_generation.csv", "results/paged_generation_memory.csv", "results/paged_generation_sharing_run.csv",
             "results/paged_generation.machine.json"), read_paged_generation,
            ("results/paged_generation.png",)),
    Section("models", "Bundled models",
            "How fast does each bundled model decode at batch 1 and 8, full precision and `q8`, beside llama.cpp on the same GGUF file, "
            "and how do MiniServe and llama.cpp compare on GGUF files from 0.5B to 8B?",
            "python -m bench.models", ("results/models.json", SIZES, *(path for path, _, _ in OTHER_HOSTS)),
            read_models),
    Section("quantization", "Weight quantization",
            "How fast are `q8` weights against bf16 and llama.cpp, how much memory do they take, and how often do they pick the same tokens?",
            "python -m bench.quantization", ("results/quantization.json",), read_quantization,
            ("results/quantization.png",)),
    Section("speculative", "Speculative decoding",
            "What does the n-gram drafter gain where the answer copies the prompt, and what does it cost where it does not?",
            "python -m bench.speculative", ("results/speculative.json",), read_speculative, ("results/speculative.png",)),
    Section("constrained_overhead", "Constrained decoding",
            "What does a JSON-schema grammar cost per token, alone and in a batch?",
            "python -m bench.constrained_overhead", ("results/constrained_overhead.json",), read_constrained,
            ("results/constrained_overhead.png",)),
    Section("embeddings", "Embeddings",
            "How many texts/s does the embedding model embed at batch 1 and 32, in-process and through `/v1/embeddings`, beside sentence-transformers? Does hybrid note retrieval help?",
            "python -m bench.embeddings", ("results/embeddings.json",), read_embeddings),
    Section("evaluate_agent", "Agent evaluation",
            "How often does the agent pick the right tool and reach the right answer on the evaluation cases?",
            "python -m bench.evaluate_agent", ("results/agent_eval.json", TOOL_CHOICE), read_agent, ("results/agent_eval.png",)),
    Section("queue_overhead", "Queue overhead",
            "How much latency do web, Redis and Celery add to a direct engine call?",
            "python -m bench.queue_overhead", ("results/queue_overhead.json", SERVED, BATCH_API), read_queue_overhead,
            ("results/queue_overhead.png", "results/queue_served.png")),
    Section("load", "Load",
            "Does the service lose, duplicate or fail jobs under 50 clients, and when a worker is killed? Does `/health` stay fast beside thousands of open streams?",
            "python -m bench.load", ("results/load.json", "results/load_kill.json", CONNECTIONS), read_load,
            ("results/load.png", "results/load_kill.png", "results/connections.png")),
    Section("scale", "Scaling out",
            "How does throughput grow with worker processes, and how fast do a dead worker's jobs move?",
            "python -m bench.scale", ("results/scale.json", "results/scale_routing.json", "results/scale_redis_cost.json"),
            read_scale, ("results/scale.png", "results/scale_routing.png")),
    Section("soak", "Soak",
            "Over minutes of mixed and hostile traffic with a worker killed and Redis down, is any job lost or any answer a 500? "
            "How long does a stream wait when its worker dies, and how much memory does a worker hold?",
            "python -m bench.soak --minutes 10", ("results/soak.json",), read_soak, ("results/soak.png",)),
    Section("fairness", "Loop fairness",
            "While jobs of every other method run, how long does a `paged` job wait between two tokens?",
            "python -m bench.fairness", ("results/fairness.json",), read_fairness, ("results/fairness.png",)),
)


# ---------------------------------------------------------------- the page and the block

def collect(root: Path) -> list[tuple[Section, Figures | None]]:
    return [(s, s.read(root) if (root / s.files[0]).exists() else None) for s in SECTIONS]


def section_lines(section: Section, figures: Figures | None, root: Path) -> list[str]:
    lines = [f"## {section.title}", "", f"*{section.question}*", ""]
    if figures is None:
        return lines + [f"Not run yet: `{section.command}` writes `{section.files[0]}`.", ""]
    lines += [f"- Command: `{clean_command(figures.command or section.command)}`",
              f"- Machine: {machine_line(figures.machine)}",
              f"- Files: {', '.join(f'`{name}`' for name in section.files)}", ""]
    lines += table(figures.header, figures.rows) + [""]
    for title, header, rows in figures.tables:
        lines += [f"{title}:", ""] + table(header, rows) + [""]
    lines += [*(f"{note}" for note in figures.notes), *([""] if figures.notes else [])]
    for png in section.pngs:
        if (root / png).exists():
            lines += [f"![{section.name}](../{png})", ""]
    return lines


def render_page(root: Path) -> str:
    sections = collect(root)
    lines = ["# Benchmarks", "",
             "Generated by `python -m bench.report` from the files under `results/`; do not edit by hand.",
             "Each section names the question, the command that wrote its files and the machine it ran on.",
             "Absolute speeds differ between machines; the ratios measured side by side in one run travel better.", ""]
    lines += [f"- [{s.title}](#{anchor(s.title)})" + ("" if f else " (not run yet)") for s, f in sections] + [""]
    for section, figures in sections:
        lines += section_lines(section, figures, root)
    return "\n".join(lines).rstrip() + "\n"


def anchor(title: str) -> str:
    return re.sub(r"[^a-z0-9 -]", "", title.lower()).replace(" ", "-")


def render_block(root: Path) -> str:
    """The README's headline figures: a few bullets, each linking to its section."""
    lines = [START]
    for section, figures in collect(root):
        for text in (figures.headline if figures else []):
            lines.append(f"- {text} ({machine_kind(figures.headline_machines.get(text, figures.machine))}; [details](docs/benchmarks.md#{anchor(section.title)})).")
    return "\n".join(lines + [END])


def rewrite_block(text: str, block: str) -> str:
    start, end = text.find(START), text.find(END)
    if start < 0 or end < start:
        raise ValueError(f"README.md lacks the {START} ... {END} block")
    return text[:start] + block + text[end + len(END):]


def outputs(root: Path = ROOT) -> dict[Path, str]:
    """The page and the README as the report would write them."""
    readme = (root / README).read_text()
    return {PAGE: render_page(root), README: rewrite_block(readme, render_block(root))}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only compare; exit 1 on a difference")
    args = parser.parse_args(argv)
    stale = []
    for path, text in outputs(ROOT).items():
        target = ROOT / path
        if target.exists() and target.read_text() == text:
            continue
        stale.append(str(path))
        if not args.check:
            target.write_text(text)
    verb = "differs" if args.check else "rewritten"
    print("\n".join(f"{name} {verb}" for name in stale) or "up to date")
    return 1 if args.check and stale else 0


if __name__ == "__main__":
    sys.exit(main())
