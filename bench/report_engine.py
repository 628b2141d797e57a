"""The report's readers for the engine's benchmarks: generation methods, batching, caches,
speculative and constrained decoding, quantization, the bundled models and loop fairness.
Each reads the files one benchmark writes under results/ into the :class:`Figures` of its section."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from bench.report_figures import Figures, Row, load_csv, load_json, machine_line, num, optional_json, ratio
from bench.report_sizes import add_sizes


def read_batching(root: Path) -> Figures:
    rows = load_csv(root, "results/batching.csv")
    modes = list(dict.fromkeys(r["mode"] for r in rows))
    by = {(r["concurrency"], r["mode"]): r for r in rows}
    levels = list(dict.fromkeys(r["concurrency"] for r in rows))
    out = [[n, *(num(by[(n, m)]["tok_per_s"], 1) if (n, m) in by else "-" for m in modes),
            ratio(float(by[(n, "batched")]["tok_per_s"]) / float(by[(n, "sequential")]["tok_per_s"]))]
           for n in levels]
    top = levels[-1]
    best = by[(top, "batched")]
    figures = Figures(["concurrent jobs", *(f"{m} tok/s" for m in modes), "batched vs sequential"], out,
                      optional_json(root, "results/batching.machine.json"))
    figures.notes.append("Aggregate tokens/s (prefill included), median of interleaved rounds.")
    figures.headline.append(
        f"Continuous batching: {top} concurrent jobs on one engine give {num(best['tok_per_s'], 1)} tok/s, "
        f"{out[-1][-1]} one-at-a-time and {ratio(best['x_hf_cb'])} transformers' own continuous batching")
    return figures


def read_compare_generation(root: Path) -> Figures:
    rows: list[Row] = []
    machine: dict[str, Any] = {}
    for dtype in ("bfloat16", "float32"):
        stem = f"results/compare_generation_{dtype}"
        machine = machine or load_json(root, f"{stem}.machine.json")
        for r in load_csv(root, f"{stem}.summary.csv"):
            rows.append([dtype, r["new_tokens"], r["method"], num(r["p50_decode_tok_s"], 1),
                         ratio(r["decode_vs_official"]), num(r["p50_ttft_ms"], 0), r["identical_to_official"]])
    figures = Figures(["dtype", "new tokens", "method", "p50 decode tok/s", "vs official", "p50 TTFT ms",
                       "same tokens as official"], rows, machine)
    longest = [r for r in rows if r[0] == "bfloat16" and r[1] == max(x[1] for x in rows)]
    speeds = ", ".join(f"`{r[2]}` {r[4]}" for r in longest if r[2] != "official")
    figures.headline.append(f"Generation methods, bf16, {longest[0][1]} new tokens, decode speed against "
                            f"`official` (transformers `generate`): {speeds}")
    return figures


def read_prefix_cache(root: Path) -> Figures:
    rows = [[r["prefix"], r["case"], r["prompt_tokens"], r["cached_tokens"], num(r["p50_ttft_ms"], 0),
             ratio(r["ttft_speedup_vs_miss"], 1), r["same_tokens_in_round"]]
            for r in load_csv(root, "results/prefix_cache.summary.csv")]
    figures = Figures(["prefix", "case", "prompt tokens", "cached tokens", "p50 TTFT ms", "TTFT vs miss",
                       "same tokens"], rows, load_json(root, "results/prefix_cache.machine.json"))
    hit = next(r for r in rows if r[0] == "long" and r[1] == "hit")
    figures.headline.append(f"Prefix cache: a {hit[2]}-token prompt whose {hit[3]} tokens are cached starts "
                            f"answering {hit[5]} sooner than a miss ({hit[4]} ms to first token)")
    if (root / CACHE_ISOLATION).exists():
        figures.tables.append(isolation_table(load_json(root, CACHE_ISOLATION)))
    return figures


CACHE_ISOLATION = "results/cache_isolation.json"


def isolation_table(data: dict) -> tuple[str, list[str], list[list]]:
    """``--isolation``: what key-b's ``cached_tokens`` says about key-a's system prompts."""
    rows = [[r["cache"], *(r[case] for case in data["cases"]), "yes" if r["leaks"] else "no"] for r in data["rows"]]
    return (f"The cache's side channel between two API keys (`{data['command']}`): the `cached_tokens` key-b sees "
            "guessing a system prompt key-a never sent, one key-a sent, and one key-a sent with its last sentence "
            "changed",
            ["prefix cache", *(f"{case}: cached tokens" for case in data["cases"]), "key-b learns something"], rows)


def read_paged_generation(root: Path) -> Figures:
    speed = [[r["method"], num(r["decode_tok_s_p50"], 1), num(r["ttft_p50_s"], 3), ratio(r["x_custom_cache"])]
             for r in load_csv(root, "results/paged_generation.csv")]
    memory = [[r["sequences"], r["prefix_sharing"], r["logical_tokens"], r["blocks_held"], num(r["kv_mib"], 1)]
              for r in load_csv(root, "results/paged_generation_memory.csv")]
    sharing = [[r["sequences"], r["prefix_sharing"], num(r["wall_s"], 2), r["cached_tokens_total"],
                num(r["ttft_p50_rest_s"], 3), r["peak_blocks"]]
               for r in load_csv(root, "results/paged_generation_sharing_run.csv")]
    figures = Figures(["method", "p50 decode tok/s", "p50 TTFT s", "vs custom_cache"], speed,
                      optional_json(root, "results/paged_generation.machine.json"))
    figures.tables.append(("KV memory of sequences sharing a system prompt",
                           ["sequences", "prefix sharing", "logical tokens", "blocks held", "KV MiB"], memory))
    figures.tables.append(("The same through the model (the first request alone, then the rest at once)",
                           ["sequences", "prefix sharing", "wall s", "cached tokens", "p50 TTFT of the rest s",
                            "peak blocks"], sharing))
    last = [r for r in memory if r[0] == memory[-1][0]]
    off, on = (next(r[4] for r in last if r[1] == flag) for flag in ("False", "True"))
    figures.headline.append(f"Paged KV cache: {last[0][0]} sequences sharing a system prompt hold {on} MiB "
                            f"of KV blocks with prefix sharing instead of {off} MiB")
    return figures


def read_speculative(root: Path) -> Figures:
    data = load_json(root, "results/speculative.json")
    rows = [[quant, ratio(s["copy_batch1_x_median"]), ratio(s["none_batch1_x_median"]),
             ratio(s["none_batch1_x_min"]), ratio(s["batch8_x"]), s["greedy_identical"]]
            for quant, s in data["summary"].items()]
    figures = Figures(["MINISERVE_QUANT", "copy-heavy, batch 1 (median)", "nothing to copy (median)",
                       "nothing to copy (worst)", "serving loop, 24 jobs", "greedy identical"], rows,
                      data["machine"], data["machine"].get("command"))
    figures.notes.append("Speed with speculative decoding on divided by off, the same prompts in one run.")
    default = data["machine"].get("default_quant_resolves_to", rows[0][0])
    pick = next(r for r in rows if r[0] == default)
    figures.headline.append(f"Speculative decoding (n-gram drafter, `{default}`): {pick[1]} on copy-heavy "
                            f"prompts at batch 1, {pick[2]} where there is nothing to copy")
    return figures


QUANT_SETTINGS = ("none", "q8", "gguf", "llama.cpp")  # what MINISERVE_QUANT offers, and the reference


def read_quantization(root: Path) -> Figures:
    data = load_json(root, "results/quantization.json")
    rows = [[r["setting"], num(r["decode_tps_b1"], 1), ratio(r["speedup_b1"]), ratio(r["vs_llama_b1"]),
             num(r.get("decode_tps_batched"), 1), num(r["agree_free"], 3), num(r.get("agree_tf"), 3),
             num(r.get("agree_llama"), 3), num(r.get("worker_mb"), 0)]
            for r in data["rows"] if r["setting"] in QUANT_SETTINGS]
    figures = Figures(["setting", "decode tok/s, batch 1", "vs none", "vs llama.cpp",
                       f"tok/s, batch {data['args'].get('batch', '')}", "agreement, free-running",
                       "agreement, teacher-forced", "agreement with llama.cpp", "worker MB"], rows, data["machine"],
                      "python -m bench.quantization")
    figures.notes.append("Agreement: the share of greedy tokens equal to the bf16 reference's, position by "
                         "position (free-running) or given the reference's tokens so far (teacher-forced); with "
                         "llama.cpp: equal to llama.cpp's own greedy tokens on the same GGUF file (free-running).")
    q8 = next(r for r in rows if r[0] == "q8")
    figures.headline.append(f"`q8` weights (the CPU default): {q8[1]} tok/s at batch 1, {q8[2]} bf16 and "
                            f"{q8[3]} llama.cpp on the same machine, free-running agreement {q8[5]}")
    return figures


def read_constrained(root: Path) -> Figures:
    data = load_json(root, "results/constrained_overhead.json")
    rows = [[s["mode"], s["variant"], num(s.get("ms_per_token_median") or s.get("ms_per_step_median"), 1),
             num(100 * s["grammar_share_median"], 1), s["all_valid"]] for s in data["summary"]]
    return Figures(["mode", "variant", "median ms per token (batch 1) or step (batch 8)", "grammar share %",
                    "all valid"], rows, data["machine"], data.get("command"))


def read_fairness(root: Path) -> Figures:
    """Recorded by the engine-loop benchmark: a paged job's token gaps while other methods run."""
    data = load_json(root, "results/fairness.json")
    summary = data.get("summary", {})
    rows = [[key, num(value, 2) if isinstance(value, float) else json.dumps(value) if isinstance(value, (dict, list)) else value]
            for key, value in summary.items()]
    figures = Figures(["", "value"], rows, data.get("machine", {}), data.get("command"))
    add_long_prompt(figures, root)
    return figures


def add_long_prompt(figures: Figures, root: Path) -> None:
    """``bench.fairness --long-prompt`` (results/long_prompt.json, when run): streams beside a
    prompt that fills the pool, one row per prefill budget, as a table of the fairness section."""
    if not (root / "results/long_prompt.json").is_file():
        return
    data = load_json(root, "results/long_prompt.json")
    rows = [[r["prefill_tokens_while_decoding"], num(r["unloaded_total_s"], 2), num(r["loaded_total_s"], 2),
             ratio(r["slowdown"]), num(r["loaded_max_gap_s"], 3), num(r["loaded_median_gap_ms"], 1),
             r["long_prompt_tokens"], num(r["long_ttft_s"], 1), "yes" if r["meets_targets"] else "no"]
            for r in data["rows"]]
    targets = data.get("targets", {})
    figures.tables.append((
        f"A prompt that fills the KV pool beside {data.get('streams', 3)} paged streams of {data.get('stream_tokens')} "
        f"tokens (`{data.get('command', '')}`; {machine_line(data['machine'])})",
        ["prefill tokens per turn while decoding", "streams alone s", "streams beside it s", "slowdown",
         "largest gap s", "median gap ms", "long prompt tokens", "its TTFT s", "meets targets"], rows))
    figures.notes.append(f"Long prompt: targets are a largest gap of at most {targets.get('max_gap_s')} s and the "
                         f"streams within {targets.get('slowdown')}x their time alone. {data.get('note', '')}".strip())


def read_models(root: Path) -> Figures:
    """Both bundled models under ``none`` and ``q8``, and llama.cpp's native tools on their GGUF files."""
    data = load_json(root, "results/models.json")
    batch = data["args"].get("batch", 8)
    llama = {r["model"]: r for r in data["rows"] if r["setting"] == "llama.cpp"}

    def vs_llama(row: dict[str, Any]) -> str:
        base = llama.get(row["model"])
        return ratio(row["decode_tps_b1"] / base["decode_tps_b1"]) if base and row is not base else "-"

    rows = [[r["model"], r["setting"] + (f" ({r['quant']})" if r.get("quant") else ""), num(r["decode_tps_b1"], 1),
             num(r.get(f"decode_tps_b{batch}"), 1), ratio(r.get("b1_vs_default")), vs_llama(r)]
            for r in data["rows"]]
    figures = Figures(["model", "setting", "decode tok/s, batch 1", f"decode tok/s, batch {batch}",
                       "batch 1 vs the default model", "batch 1 vs llama.cpp"], rows, data["machine"],
                      "python -m bench.models")
    figures.notes.append(f"llama.cpp: {data.get('llama_cpp', 'not run')}. Its tools build natively from the "
                         "`llama-cpp-python` sdist with `scripts/build_llama_cpp.sh [PREFIX]` (pinned 0.3.36; "
                         "cmake and ninja, the CPU features named rather than detected, as a virtual machine's CPU "
                         "can hide some of what its compiler detects; it installs the binaries and llama.cpp's "
                         "converter into PREFIX, default `/work/llama-bin`); pass `--llama-bin PREFIX`.")
    figures.notes.append("The batch-1 ratio between the models depends on the CPU, for llama.cpp as for us: the "
                         "small model's 30 layers of small matrices carry a fixed cost per layer (the thread team "
                         "meets at barriers between the pieces of each) that weighs more on some machines; "
                         "llama.cpp's own ratio on the same files, in its rows, shows the machine's.")
    for name, met in data.get("checks", {}).items():
        figures.notes.append(f"Target {name}: {'met' if met else 'not met'}.")
    by = {(r["model"], r["setting"]): r for r in data["rows"]}
    small = by.get(("smollm2-135m-instruct", "q8"))
    if small:
        figures.headline.append(f"Second bundled model: SmolLM2-135M under `q8` decodes {num(small['decode_tps_b1'], 1)} "
                                f"tok/s at batch 1, {ratio(small['b1_vs_default'])} the default model and "
                                f"{vs_llama(small)} llama.cpp on the same file")
    add_sizes(figures, root)  # python -m bench.models --sizes: GGUF files of several sizes
    return figures
