"""Random-weight GGUF files of a :class:`bench.model_shapes.ModelShape`, built once and cached.

The shape's config gives the parameter names and shapes (transformers on the meta device), each
filled with random bf16 values (normal, std 0.02) and written a shard at a time with a tokenizer
(:mod:`bench.model_shapes` says which); llama.cpp's own converter (``convert_hf_to_gguf.py``,
installed beside the binaries by scripts/build_llama_cpp.sh) writes a BF16 GGUF;
``llama-quantize`` makes each asked type from it. Files land in
``<cache_dir>/sizes/<shape>-<shape key>-<TYPE>.gguf``; the safetensors folder and the BF16 file
are deleted once the types are made. No more than one 2 GB shard is ever in memory, so even the
8B shape builds on a 24 GB machine (it needs 16 GB of disk for the BF16 file meanwhile).
"""
from __future__ import annotations

import math
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.model_shapes import ModelShape, hf_config

CONVERTER = "convert_hf_to_gguf.py"
QWEN_TOKENIZER_MODEL = "default"  # the bundled default model: Qwen2.5's 151,936-entry vocabulary


def gguf_path(cache_dir: Path, shape: ModelShape, quant: str) -> Path:
    return Path(cache_dir) / "sizes" / f"{shape.name}-{shape.key()}-{quant.upper()}.gguf"


def ensure_files(shape: ModelShape, quants: list[str], llama_bin: Path, cache_dir: Path) -> dict[str, Path]:
    """Each asked type's file for ``shape``, building what is missing (minutes, once)."""
    files = {q: gguf_path(cache_dir, shape, q) for q in quants}
    missing = [q for q, path in files.items() if not path.is_file()]
    if not missing:
        return files
    _require(llama_bin / "llama-quantize")
    started = time.perf_counter()
    bf16 = bf16_file(shape, llama_bin, cache_dir)
    for quant in missing:
        partial = files[quant].with_suffix(".partial")
        _run([str(llama_bin / "llama-quantize"), str(bf16), str(partial), quant.upper(), "2"])
        partial.replace(files[quant])
    bf16.unlink()
    print(f"built {shape.name} {', '.join(missing)} in {time.perf_counter() - started:.0f} s", flush=True)
    return files


def bf16_file(shape: ModelShape, llama_bin: Path, cache_dir: Path) -> Path:
    """The converter's BF16 GGUF of ``shape`` (kept until the asked types are made from it)."""
    target = gguf_path(cache_dir, shape, "BF16")
    target = target.with_name("." + target.name)
    if target.is_file():
        return target
    _require(llama_bin / CONVERTER)
    target.parent.mkdir(parents=True, exist_ok=True)
    remove_leftovers(target.parent, shape)
    with tempfile.TemporaryDirectory(dir=target.parent, prefix=f".build-{shape.name}-") as tmp:
        folder = save_random_model(shape, Path(tmp) / "hf", cache_dir)
        partial = Path(tmp) / "model-bf16.gguf"
        _run([sys.executable, str(llama_bin / CONVERTER), str(folder), "--outtype", "bf16", "--outfile", str(partial)])
        partial.replace(target)
    return target


def remove_leftovers(folder: Path, shape: ModelShape) -> None:
    """Delete what a killed build of ``shape`` left behind: a SIGTERM or SIGKILL skips the
    temporary folder's clean-up, and at 8B its safetensors are 16 GB of disk."""
    for leftover in folder.glob(f".build-{shape.name}-*"):
        shutil.rmtree(leftover, ignore_errors=True)
    for partial in folder.glob(f"{shape.name}-{shape.key()}-*.partial"):
        partial.unlink(missing_ok=True)


def _require(tool: Path) -> None:
    if not tool.exists():
        raise SystemExit(f"{tool} is missing: build llama.cpp's tools with scripts/build_llama_cpp.sh "
                         f"and pass their folder with --llama-bin")


def save_random_model(shape: ModelShape, folder: Path, cache_dir: Path) -> Path:
    """A safetensors folder of ``shape`` with random bf16 weights and the family's tokenizer.

    The model is built on the meta device, so only its parameter names and shapes exist; each
    tensor is then drawn, written into a shard of about 2 GB and dropped. The build never holds
    more than one shard, which is what lets the 8B shape (16 GB of bf16) be built on 24 GB.
    Matrices are normal with std 0.02 (transformers' initializer range), norm weights one and
    biases zero, as transformers initializes them.
    """
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    config_obj = AutoConfig.for_model(**hf_config(shape))
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config_obj, dtype=torch.bfloat16)
    parameters = [(name, tuple(p.shape)) for name, p in model.named_parameters()]  # a tied matrix once
    del model
    folder.mkdir(parents=True, exist_ok=True)
    config_obj.save_pretrained(folder)
    _write_shards(parameters, folder, torch.Generator().manual_seed(0))
    tokenizer(shape, cache_dir).save_pretrained(folder)
    return folder


SHARD_BYTES = 2 << 30


def _write_shards(parameters: list[tuple[str, tuple[int, ...]]], folder: Path, generator) -> None:
    """Random bf16 tensors in numbered shards plus the index that maps each name to its shard."""
    import json

    from safetensors.torch import save_file

    groups: list[list[tuple[str, tuple[int, ...]]]] = [[]]
    size = 0
    for name, dims in parameters:
        nbytes = 2 * math.prod(dims)
        if groups[-1] and size + nbytes > SHARD_BYTES:
            groups.append([])
            size = 0
        groups[-1].append((name, dims))
        size += nbytes
    weight_map = {}
    for number, group in enumerate(groups, 1):
        shard = f"model-{number:05d}-of-{len(groups):05d}.safetensors"
        save_file({name: _random_tensor(name, dims, generator) for name, dims in group},
                  str(folder / shard), metadata={"format": "pt"})
        weight_map.update({name: shard for name, _ in group})
    (folder / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))


def _random_tensor(name: str, dims: tuple[int, ...], generator):
    import torch

    if len(dims) >= 2:
        return (torch.randn(dims, generator=generator) * 0.02).to(torch.bfloat16)
    if name.endswith("bias"):
        return torch.zeros(dims, dtype=torch.bfloat16)
    return torch.ones(dims, dtype=torch.bfloat16)


def tokenizer(shape: ModelShape, cache_dir: Path):
    """The default model's tokenizer for Qwen shapes; SmolLM2's (from its bundled GGUF) for Llama's."""
    from transformers import AutoTokenizer

    if shape.family == "qwen2":
        from core.settings import load_settings
        from engine.prepare_default import prepare_bundled_model

        return AutoTokenizer.from_pretrained(prepare_bundled_model(QWEN_TOKENIZER_MODEL,
                                                                   load_settings(cache_dir=cache_dir)))
    from engine.prepare_default import smollm2_gguf_path

    gguf = smollm2_gguf_path()
    return AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)


def _run(command: list[str]) -> None:
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{Path(command[0]).name} {' '.join(command[1:3])} exited {done.returncode}: "
                           f"{(done.stderr or done.stdout)[-800:]}")
