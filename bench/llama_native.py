"""llama.cpp's own native tools on a GGUF file: the outside reference for decode speed.

``llama-bench`` times text generation of one sequence; ``llama-batched-bench`` times ``B``
sequences decoding together in one context (llama.cpp's continuous-batching path, as
``llama-server -np B`` serves it). Both run warm (``llama-bench`` repeats and averages;
``batched-bench`` runs a warm-up first) on the same thread count as our engine, and read the
file in its own quantization, which is llama.cpp at its best on it.
"""
from __future__ import annotations

import argparse
import json
import subprocess
from pathlib import Path
from typing import Any

from core.model_source import BUNDLED_MODELS, SMOLLM2_MODEL
from core.settings import Settings

def gguf_file(model: str) -> Path:
    """The bundled GGUF file that ``model`` is prepared from."""
    if model == SMOLLM2_MODEL:
        from engine.prepare_default import smollm2_gguf_path
        return smollm2_gguf_path()
    from bench.quantization_llamacpp import gguf_path
    return gguf_path(Settings().cache_dir)


def _run(command: list[str]) -> str:
    done = subprocess.run(command, capture_output=True, text=True, timeout=900)
    if done.returncode != 0:
        raise RuntimeError(f"{Path(command[0]).name} exited {done.returncode}: {done.stderr[-400:]}")
    return done.stdout


def batch1_tps(binary: Path, gguf: Path, tokens: int, threads: int) -> float:
    """Text-generation tokens/s of one sequence (llama-bench, 3 repetitions averaged)."""
    out = _run([str(binary / "llama-bench"), "-m", str(gguf), "-p", "0", "-n", str(tokens), "-t", str(threads),
                "-r", "3", "-o", "json"])
    return float(json.loads(out)[0]["avg_ts"])


def batched_tps(binary: Path, gguf: Path, batch: int, tokens: int, threads: int) -> float:
    """Decode tokens/s of ``batch`` sequences together (llama-batched-bench, 16-token prompts)."""
    out = _run([str(binary / "llama-batched-bench"), "-m", str(gguf), "-c", "4096", "-npp", "16",
                "-ntg", str(tokens), "-npl", str(batch), "-t", str(threads), "--output-format", "jsonl"])
    lines = [json.loads(line) for line in out.splitlines() if line.startswith("{") and '"speed_tg"' in line]
    return float(lines[-1]["speed_tg"])


def llama_rows(models: list[str], args: argparse.Namespace) -> tuple[list[dict[str, Any]], str]:
    """One ``llama.cpp`` row per model, in the shape of bench.models' rows, and a note."""
    binary = Path(args.llama_bin)
    rows = []
    for model in models:
        gguf = gguf_file(model)
        rows.append({"model": BUNDLED_MODELS.get(model, model), "setting": "llama.cpp",
                     "decode_tps_b1": batch1_tps(binary, gguf, args.tokens, args.threads),
                     f"decode_tps_b{args.batch}": batched_tps(binary, gguf, args.batch, args.tokens, args.threads),
                     "gguf": gguf.name, "quant": quant_of(gguf)})
    return rows, f"llama-bench and llama-batched-bench ({version(binary)}), each GGUF in its own quantization"


def quant_of(gguf: Path) -> str:
    """The quantization a bundled file's name ends with (``...-q4_k_m.gguf``, ``....Q4_1.gguf``)."""
    return gguf.stem.split(".")[-1].split("-")[-1].upper()


def version(binary: Path) -> str:
    """llama.cpp's own version line (``0.5.0-dev (build 1, commit 0c1e570)``)."""
    done = subprocess.run([str(binary / "llama-bench"), "--version"], capture_output=True, text=True, timeout=60)
    line = next((l for l in (done.stdout + done.stderr).splitlines() if l.startswith("version:")), "version: unknown")
    return "llama.cpp " + line.split(":", 1)[1].strip()
