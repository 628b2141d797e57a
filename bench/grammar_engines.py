"""Choosing the grammar engine: xgrammar vs llguidance on this CPU, with the model's vocabulary.

    python -m bench.grammar_engines [--rounds 5] [--out results/grammar_engines]

For each typical tool-argument schema (and ``json_object``), side by side in one run,
interleaved round by round, both engines:

- **setup**: building the engine's tokenizer view of the 151k vocabulary (once per process);
- **compile**: a schema to a ready matcher, no cache (xgrammar's compiler cache off; llguidance
  builds its matcher lazily, so its figure includes the first mask);
- **mask**: per token, computing the next-token bitmask while walking a valid answer's tokens
  (the answer is the schema's example, tokenized as the model would write it), and applying it
  to a 151,936-logit vector with our own :func:`engine.constrained.bitmask.apply_bitmask`
  (same code for both, so it is reported once, apart);
- **our grammars** (llguidance through :class:`engine.constrained.GrammarCompiler`, as the
  worker runs them): compile time of each case's ``json_schema`` grammar and of the tool-call
  grammars (``required`` over 3 tools, lazy ``auto``), cold and then from the cache;
- **install size** of the package and the dependencies it pulls that the project does not
  already need (xgrammar requires triton and apache-tvm-ffi), and the **license**.

Writes ``<out>.csv`` (one row per engine x schema), ``<out>.json`` (summary + machine) and
``<out>.png``.

xgrammar is not a project requirement (with triton it installs ~1 GB): to rerun the
comparison, ``pip install xgrammar==0.2.9`` first (and uninstall it after).
"""
from __future__ import annotations

import argparse
import json
import time
from importlib import metadata
from pathlib import Path
from typing import Any, Callable

import torch

from bench.grammar_cases import CASES, GrammarCase
from bench.machine import machine_summary
from bench.stats import percentile, print_table, write_csv, write_json
from engine.constrained.bitmask import apply_bitmask, words_for

MODEL_VOCAB = 151936  # Qwen2.5's lm_head rows (tokenizer: 151,665 tokens)


def package_size_mb(dist_name: str) -> float:
    """Bytes on disk of every file a distribution installed."""
    dist = metadata.distribution(dist_name)
    total = 0
    for f in dist.files or []:
        path = Path(dist.locate_file(f))
        if path.is_file():
            total += path.stat().st_size
    return total / 2**20


class Engine:
    """One library behind a tiny interface: compile(case) -> matcher; mask(matcher, buf); accept."""

    name: str
    dist: str
    extra_dists: tuple[str, ...] = ()

    def compile(self, case: GrammarCase) -> Any: ...
    def fill(self, matcher: Any, buf: torch.Tensor) -> None: ...
    def accept(self, matcher: Any, token: int) -> bool: ...


class XGrammar(Engine):
    name, dist, extra_dists = "xgrammar", "xgrammar", ("triton", "apache-tvm-ffi")

    def __init__(self, tokenizer: Any, eos: list[int]) -> None:
        import xgrammar as xgr

        self.xgr = xgr
        info = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=MODEL_VOCAB, stop_token_ids=eos)
        self.compiler = xgr.GrammarCompiler(info, cache_enabled=False, max_threads=1)

    def compile(self, case: GrammarCase) -> Any:
        if case.schema is None:
            compiled = self.compiler.compile_builtin_json_grammar()
        else:
            compiled = self.compiler.compile_json_schema(json.dumps(case.schema), any_whitespace=False,
                                                         separators=(",", ":"))
        return self.xgr.GrammarMatcher(compiled)

    def fill(self, matcher: Any, buf: torch.Tensor) -> None:
        matcher.fill_next_token_bitmask(buf)

    def accept(self, matcher: Any, token: int) -> bool:
        return matcher.accept_token(token)


class LLGuidance(Engine):
    name, dist = "llguidance", "llguidance"

    def __init__(self, tokenizer: Any, eos: list[int]) -> None:
        import llguidance
        import llguidance.hf

        self.llg = llguidance
        self.tokenizer = llguidance.hf.from_tokenizer(tokenizer, n_vocab=MODEL_VOCAB, eos_token=eos)

    def compile(self, case: GrammarCase) -> Any:
        schema = case.schema if case.schema is not None else {"type": "object"}
        grammar = self.llg.LLMatcher.grammar_from_json_schema(
            schema, defaults={"whitespace_flexible": False})
        matcher = self.llg.LLMatcher(self.tokenizer, grammar, log_level=0)
        if matcher.is_error():
            raise RuntimeError(matcher.get_error())
        return matcher

    def fill(self, matcher: Any, buf: torch.Tensor) -> None:
        matcher.unsafe_compute_mask_ptr(buf.data_ptr(), buf.numel() * 4)

    def accept(self, matcher: Any, token: int) -> bool:
        return matcher.consume_token(token)


def timed(fn: Callable[[], Any]) -> tuple[Any, float]:
    start = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - start


def walk(engine: Engine, matcher: Any, tokens: list[int], logits: torch.Tensor,
         mask_s: list[float], apply_s: list[float]) -> None:
    """Mask then accept each token of a valid answer (fails loudly if the engine refuses one)."""
    buf = torch.zeros(1, words_for(MODEL_VOCAB), dtype=torch.int32)  # xgrammar wants [batch, words]
    for token in tokens:
        _, dt = timed(lambda: engine.fill(matcher, buf))
        mask_s.append(dt)
        masked, dt = timed(lambda: apply_bitmask(logits, buf[0]))
        apply_s.append(dt)
        if not torch.isfinite(masked[token]):
            raise AssertionError(f"{engine.name} masked out a token of a valid answer ({token})")
        if not engine.accept(matcher, token):
            raise AssertionError(f"{engine.name} refused token {token}")


def run(rounds: int, model_dir: str) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    eos = [151645, 151643]
    engines: list[Engine] = []
    setup: dict[str, float] = {}
    for cls in (LLGuidance, XGrammar):
        engine, dt = timed(lambda: cls(tokenizer, eos))
        engines.append(engine)
        setup[engine.name] = dt
    logits = torch.randn(MODEL_VOCAB)
    samples: dict[tuple[str, str], dict[str, list[float]]] = {}
    for r in range(rounds):
        for case in CASES:
            tokens = tokenizer.encode(case.example_text(), add_special_tokens=False)
            order = engines if r % 2 == 0 else engines[::-1]
            for engine in order:
                s = samples.setdefault((engine.name, case.name), {"compile": [], "mask": [], "apply": []})
                matcher, dt = timed(lambda: engine.compile(case))
                s["compile"].append(dt)
                walk(engine, matcher, tokens, logits, s["mask"], s["apply"])
    rows = []
    for (name, case_name), s in samples.items():
        rows.append({"engine": name, "schema": case_name,
                     "compile_p50_ms": percentile(s["compile"], 50) * 1e3,
                     "compile_max_ms": max(s["compile"]) * 1e3,
                     "mask_p50_us": percentile(s["mask"], 50) * 1e6,
                     "mask_p90_us": percentile(s["mask"], 90) * 1e6,
                     "mask_max_us": max(s["mask"]) * 1e6,
                     "apply_p50_us": percentile(s["apply"], 50) * 1e6,
                     "tokens": len(s["mask"]) // rounds})
    summary: dict[str, Any] = {"engines": {}}
    for engine in engines:
        mine = [k for k in samples if k[0] == engine.name]
        all_compile = [v for k in mine for v in samples[k]["compile"]]
        all_mask = [v for k in mine for v in samples[k]["mask"]]
        all_apply = [v for k in mine for v in samples[k]["apply"]]
        sizes = {d: round(package_size_mb(d), 1) for d in (engine.dist, *engine.extra_dists)}
        summary["engines"][engine.name] = {
            "version": metadata.version(engine.dist),
            "license": metadata.metadata(engine.dist).get("License-Expression")
            or metadata.metadata(engine.dist).get("License"),
            "setup_s": round(setup[engine.name], 3),
            "compile_p50_ms": round(percentile(all_compile, 50) * 1e3, 2),
            "mask_p50_us": round(percentile(all_mask, 50) * 1e6, 1),
            "mask_p99_us": round(percentile(all_mask, 99) * 1e6, 1),
            "apply_p50_us": round(percentile(all_apply, 50) * 1e6, 1),
            "install_mb": sizes, "install_total_mb": round(sum(sizes.values()), 1)}
    return rows, summary


def our_grammars(tokenizer: Any, eos: list[int], rounds: int) -> list[dict[str, Any]]:
    """Compile times of the grammars the service builds (core.grammar), cold and cached."""
    from bench.grammar_cases import CALCULATOR, SEARCH, WEATHER
    from core import grammar
    from core.grammar import ToolSpec
    from engine.constrained.compiler import GrammarCompiler

    tools = [ToolSpec("get_weather", WEATHER), ToolSpec("calculator", CALCULATOR), ToolSpec("search", SEARCH)]
    grammars = {f"json_schema:{c.name}": grammar.json_schema(c.schema) if c.schema else grammar.json_object()
                for c in CASES}
    grammars["tools:required(3)"] = grammar.tool_calls(tools, parallel=False)
    grammars["tools:auto(3, lazy)"] = grammar.tool_calls(tools, lazy=True)
    compiler = GrammarCompiler(tokenizer, MODEL_VOCAB, eos)
    rows = []
    for name, constraint in grammars.items():
        cold, cached = [], []
        for _ in range(rounds):
            cold.append(timed(lambda: compiler._build(constraint))[1])
        compiler.compile(constraint)
        for _ in range(rounds):
            cached.append(timed(lambda: compiler.compile(constraint))[1])
        rows.append({"grammar": name, "compile_p50_ms": percentile(cold, 50) * 1e3,
                     "compile_max_ms": max(cold) * 1e3, "cached_p50_us": percentile(cached, 50) * 1e6})
    return rows


def plot(rows: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    schemas = sorted({r["schema"] for r in rows})
    engines = sorted({r["engine"] for r in rows})
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    width = 0.8 / len(engines)
    for i, engine in enumerate(engines):
        by = {r["schema"]: r for r in rows if r["engine"] == engine}
        xs = [j + i * width for j in range(len(schemas))]
        axes[0].bar(xs, [by[s]["compile_p50_ms"] for s in schemas], width, label=engine)
        axes[1].bar(xs, [by[s]["mask_p50_us"] for s in schemas], width, label=engine)
    for ax, title in zip(axes, ("compile p50 (ms, no cache)", "mask per token p50 (us)")):
        ax.set_xticks([j + 0.4 - width / 2 for j in range(len(schemas))], schemas, rotation=30, ha="right")
        ax.set_title(title)
        ax.set_yscale("log")
        ax.legend()
    fig.suptitle("Grammar engines on the 151,936-token vocabulary (this CPU)")
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main() -> None:
    from core.settings import Settings
    from engine.prepare_default import default_model_dir

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--model-dir", default=None, help="tokenizer folder (default: the bundled model)")
    parser.add_argument("--out", default="results/grammar_engines")
    args = parser.parse_args()
    torch.set_num_threads(1)
    model_dir = args.model_dir or str(default_model_dir(Settings()))
    rows, summary = run(args.rounds, model_dir)
    print_table(rows, ["engine", "schema", "compile_p50_ms", "mask_p50_us", "mask_p90_us", "apply_p50_us", "tokens"])
    from transformers import AutoTokenizer

    ours = our_grammars(AutoTokenizer.from_pretrained(model_dir), [151645, 151643], args.rounds)
    print_table(ours, ["grammar", "compile_p50_ms", "compile_max_ms", "cached_p50_us"])
    summary["our_grammars"] = ours
    print(json.dumps(summary["engines"], indent=2))
    out = Path(args.out)
    summary.update(command="python -m bench.grammar_engines " + f"--rounds {args.rounds}",
                   machine=machine_summary())
    write_csv(out.with_suffix(".csv"), rows)
    write_json(out.with_suffix(".json"), summary)
    plot(rows, out.with_suffix(".png"))
    print(f"wrote {out}.csv/.json/.png")


if __name__ == "__main__":
    main()
