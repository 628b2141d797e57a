"""The real-model part of ``python -m bench.quantization``: quality, speed, llama.cpp.

One process loads the model once (bf16) and builds one hand-written forward per setting
over it, so the settings can be interleaved round by round. The quantized forwards keep
no bf16 reference (as in a worker, where the bf16 copies are freed), so prefill and
batched steps run the packed kernels too. The machine's read bandwidth is measured at the
start and the end of the run; each setting's decode speed is also given as a share of its
floor, ``bandwidth / bytes read per token``.
"""
from __future__ import annotations

import argparse
import statistics
from typing import Any

import torch

from bench.quantization_batch import batched_greedy
from bench.quantization_quality import free_running, teacher_forced
from bench.stats import machine_info, pyplot, read_bandwidth_gbs, summarize
from core.settings import load_settings
from engine.engine import Engine
from engine.openmp import release_thread_team
from engine.forward import Qwen2Forward
from engine.loader import load_model
from engine.packed import packing_available
from engine.quant.model import bytes_per_token, forward_weights, pack_weights, quantize_weights
from engine.types import GenerationRequest, SamplingParams
from engine.weights import fuse_projections

LLAMA = "llama.cpp"


def load_engines(args: argparse.Namespace, modes: tuple[str, ...]) -> tuple[dict[str, Engine], dict[str, Qwen2Forward]]:
    settings = load_settings(model=args.model, dtype="bfloat16", device="cpu", threads=args.threads, quant="none")
    loaded = load_model(settings)
    weights = fuse_projections(loaded.model)  # plain bf16: what the quantized plans start from
    # none runs as a worker runs it: projections prepacked for oneDNN where the CPU has them
    packed = pack_weights(weights) if packing_available(weights.dtype, weights.device) else weights
    forwards = {"none": Qwen2Forward(packed)}
    for mode in modes:
        if mode == "gguf":  # the model's GGUF file on its own blocks, as MINISERVE_QUANT=gguf loads it
            native = load_model(load_settings(model=args.model, dtype="bfloat16", device="cpu",
                                              threads=args.threads, quant="gguf"))
            forwards[mode] = Qwen2Forward(forward_weights(native.model))
        elif mode != "none":
            # as a worker quantizes them (engine.quant.model.quantize_model): from the folder's stored values
            forwards[mode] = Qwen2Forward(quantize_weights(weights, mode, source=loaded.path)[0])
    engines = {}
    for mode, forward in forwards.items():
        engine = Engine(settings, loaded)
        engine.state("forward", lambda forward=forward: forward)  # what forward_for(engine) returns
        engines[mode] = engine
    return engines, forwards


def plain_request(prompt: str, tokens: int) -> GenerationRequest:
    # greedy, no repetition penalty: llama.cpp runs the same way
    sampling = SamplingParams(max_new_tokens=tokens, temperature=0.0, repetition_penalty=1.0)
    return GenerationRequest(messages=[{"role": "user", "content": prompt}], sampling=sampling,
                             method="custom_cache")


def _llama(args: argparse.Namespace):
    if args.no_llama:
        return None
    from bench.quantization_llamacpp import LlamaClient, ensure_llama_cpp, gguf_path

    ensure_llama_cpp()
    settings = load_settings(model=args.model)
    return LlamaClient(gguf_path(settings.cache_dir), args.threads)


def run_model_benchmark(args: argparse.Namespace, prompts: list[str], modes: tuple[str, ...]) -> dict[str, Any]:
    bandwidth = [read_bandwidth_gbs()]
    llama = _llama(args)
    engines, forwards = load_engines(args, modes)
    step_bytes = {mode: bytes_per_token(forwards[mode].weights) for mode in modes}
    if llama:
        step_bytes[LLAMA] = llama.info.get("bytes_per_token", 0)
    base = engines["none"]
    prompt_ids = [base.prompt(plain_request(p, 1)).ids for p in prompts]
    tokens = args.max_new_tokens
    settings = list(modes) + ([LLAMA] if llama else [])

    def generate(setting: str, index: int) -> dict[str, Any]:
        if setting == LLAMA:
            return llama.generate(prompt_ids[index], tokens)
        result = engines[setting].generate(plain_request(prompts[index], tokens))
        return {"tokens": result.token_ids, "ttft_s": result.timings.ttft_s,
                "decode_tps": result.timings.decode_tokens_per_s}

    # quality: every prompt once per setting (also the warmup)
    outputs = {s: [generate(s, i)["tokens"] for i in range(len(prompts))] for s in settings}
    reference = outputs["none"]
    quality = {s: free_running(reference, outputs[s]) for s in settings}
    for mode in modes:
        quality[mode]["agree_tf"] = 1.0 if mode == "none" else teacher_forced(forwards[mode], prompt_ids, reference)
        if llama:  # greedy tokens equal to llama.cpp's on the same file, position by position
            quality[mode]["agree_llama"] = free_running(outputs[LLAMA], outputs[mode])["agree_free"]
    print("quality:", quality, flush=True)

    # speed, batch 1: interleaved rounds, setting order rotated each round. The teacher-forced
    # pass above ran on this thread: release its OpenMP team first (engine.openmp explains why).
    release_thread_team()
    samples: dict[str, dict[str, list[float]]] = {s: {"decode_tps": [], "ttft_s": []} for s in settings}
    for round_ in range(args.repeats):
        order = settings[round_ % len(settings):] + settings[:round_ % len(settings)]
        for index in range(min(args.speed_prompts, len(prompts))):
            for setting in order:
                out = generate(setting, (index * 2 + round_) % len(prompts))  # zh and en alternate
                samples[setting]["decode_tps"].append(out["decode_tps"])
                samples[setting]["ttft_s"].append(out["ttft_s"])
        print(f"round {round_ + 1}/{args.repeats}:",
              {s: round(statistics.median(v["decode_tps"]), 1) for s, v in samples.items()}, flush=True)

    # speed, batched: one decode step carries one token of each of --batch sequences
    batch_prompts = [prompt_ids[i % len(prompt_ids)] for i in range(args.batch)]
    batched: dict[str, list[float]] = {m: [] for m in modes}
    for round_ in range(2):
        for mode in modes:
            batched[mode].append(batched_greedy(forwards[mode], batch_prompts, tokens)["decode_tps"])
    print("batched:", {m: [round(v, 1) for v in vals] for m, vals in batched.items()}, flush=True)
    if llama:
        llama_rss = llama.generate(prompt_ids[0], 4).get("rss_mb")
        llama_before = llama.info.get("rss_before_mb", 0.0)
        llama.close()
    bandwidth.append(read_bandwidth_gbs())
    gbs = statistics.median(bandwidth)

    rows = []
    none_b1 = statistics.median(samples["none"]["decode_tps"])
    llama_b1 = statistics.median(samples[LLAMA]["decode_tps"]) if llama else None
    for setting in settings:
        b1 = summarize(samples[setting]["decode_tps"])
        row = {"setting": setting, "decode_tps_b1": round(b1["p50"], 2),
               "decode_tps_b1_mean": round(b1["mean"], 2), "decode_tps_b1_p90": round(b1["p90"], 2),
               "speedup_b1": round(b1["p50"] / none_b1, 2),
               "vs_llama_b1": round(b1["p50"] / llama_b1, 2) if llama_b1 else "",
               "ttft_ms": round(summarize(samples[setting]["ttft_s"])["p50"] * 1000, 1),
               "agree_free": round(quality[setting]["agree_free"], 3),
               "identical": f"{quality[setting]['identical']}/{len(prompts)}",
               "agree_tf": round(quality[setting].get("agree_tf", float("nan")), 3),
               "agree_llama": round(quality[setting]["agree_llama"], 3) if "agree_llama" in quality[setting] else "",
               "mb_per_token": round(step_bytes.get(setting, 0) / 1e6, 1)}
        floor = gbs * 1e9 / step_bytes[setting] if step_bytes.get(setting) else 0.0
        row["floor_tps"] = round(floor, 1)
        row["pct_of_floor"] = round(100 * b1["p50"] / floor, 1) if floor else ""
        if setting in batched:
            row["decode_tps_batched"] = round(statistics.median(batched[setting]), 2)
            row["batched_vs_none"] = round(row["decode_tps_batched"] / statistics.median(batched["none"]), 2)
        else:
            row["decode_tps_batched"] = row["batched_vs_none"] = ""
        if setting == LLAMA:
            row["model_rss_mb"] = round(llama_rss - llama_before, 1)
            row["process_rss_mb"] = round(llama_rss, 1)
            row["agree_tf"] = ""
        rows.append(row)
    by = {r["setting"]: r for r in rows}
    checks = {"no setting slower than none batched (>= 0.95x)":
              all(r["batched_vs_none"] >= 0.95 for r in rows if r["batched_vs_none"] != "")}
    default = args.default_setting
    if llama_b1 and default in by:
        checks[f"{default} b1 >= 1.2x llama.cpp"] = by[default]["decode_tps_b1"] >= 1.2 * llama_b1
        checks[f"{default} free-running agreement >= llama.cpp's"] = (
            by[default]["agree_free"] >= by[LLAMA]["agree_free"])
    machine = {**machine_info(), "dtype": "bfloat16", "group_size": 32,
               "max_new_tokens": tokens, "batch": args.batch, "read_bandwidth_gbs": [round(b, 2) for b in bandwidth]}
    return {"rows": rows, "checks": checks, "machine": machine,
            "samples": {"b1": samples, "batched": batched, "quality": quality}}


def plot(rows: list[dict[str, Any]], path) -> None:
    plt = pyplot()
    names = [r["setting"] for r in rows]
    fig, axes = plt.subplots(1, 4, figsize=(17, 4))
    axes[0].bar(names, [r["decode_tps_b1"] for r in rows], color="tab:blue")
    axes[0].set_title("decode tokens/s, batch 1")
    batched = [(r["setting"], r["decode_tps_batched"]) for r in rows if r["decode_tps_batched"] != ""]
    axes[1].bar([b[0] for b in batched], [b[1] for b in batched], color="tab:green")
    axes[1].set_title("decode tokens/s, batched")
    axes[2].bar(names, [r["model_rss_mb"] or 0 for r in rows], color="tab:orange")
    axes[2].set_title("resident MB of the loaded model")
    width = 0.4
    xs = range(len(names))
    axes[3].bar([x - width / 2 for x in xs], [r["agree_tf"] if r["agree_tf"] != "" else 0 for r in rows],
                width, label="teacher-forced")
    axes[3].bar([x + width / 2 for x in xs], [r["agree_free"] for r in rows], width, label="free-running")
    axes[3].set_xticks(list(xs), names)
    axes[3].set_ylim(0, 1.05)
    axes[3].set_title("greedy agreement with none")
    axes[3].legend(loc="lower left")
    for ax in axes:
        ax.grid(axis="y", alpha=0.3)
    fig.suptitle("MiniServe weight-only quantization vs llama.cpp (2 threads, CPU)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
