"""``python -m bench.models --sizes``: MiniServe beside llama.cpp on GGUF files from 0.5B to 8B.

Question: on the model sizes people run on CPUs, how fast does MiniServe decode at batch 1
and 8 and process a 512-token prompt, how much memory does its worker take, and how long
until it is ready, against llama.cpp's own tools on the same file, and how close is each
batch-1 decode to the machine's bandwidth floor?

Each shape of :mod:`bench.model_shapes` is built once as random-weight GGUF files in the asked
types (:mod:`bench.model_build`; decode speed depends on shapes, not values). For each file:

- MiniServe (:mod:`bench.model_sizes_ours`, a child process per start, the worker's own
  memory): a first start on an empty cache folder (the file's one-time preparation included;
  ready time and peak memory), then a second start, which is timed;
- llama.cpp (:mod:`bench.model_sizes_llama`): ``llama-bench`` pp512 and tg, ``llama-server``
  with one slot per client for batch 8, its ready time and memory;
- batch 1 again, in rounds (``--b1-rounds``, 3 by default): the sides take turns, a
  MiniServe second start with batch 1 only, then ``llama-bench`` tg only, the order flipped
  each round. A side's batch-1 figure is the median of its rounds: turns seconds apart see
  the same bandwidth, where the sides' main measurements, minutes apart, saw whatever the
  host's drift gave each;
- the bandwidth floor (:mod:`bench.bandwidth_floor`): the machine's read bandwidth over the
  bytes a token reads. On a shared host the bandwidth drifts (30 to 51 GB/s within one run on
  a 2-core EPYC), so it is sampled (``--threads`` threads, a 1 GB buffer) right before and right
  after each side's measurement (and each batch-1 round), and that side's share of the floor
  uses the better of its own two samples (the median over its rounds of each round's share,
  where it has rounds); the file's ``floor_tps`` uses the median of every sample of the run.

Results are written after every file (a partial run keeps what it measured) to
``results/model_sizes.json`` and ``.csv``. The machine is shared on some hosts: ``--note``
records that in the file; ratios measured side by side in one run are what travel.

Run: ``python -m bench.models --sizes [--size qwen2.5-1.5b ...] [--with-8b] [--types Q4_K_M Q8_0]
[--threads 2] [--tokens 64] [--b1-rounds 3] [--llama-bin DIR] [--ours-quant auto q8 gguf] [--skip-ours] [--skip-llama] [--no-first-start] [--note TEXT]``.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable

from bench.bandwidth_floor import floor_tps, pct_of_floor, read_tensors, token_bytes
from bench.model_build import ensure_files
from bench.model_shapes import DEFAULT_SIZES, ModelShape, param_count, resolve
from bench.stats import machine_info, print_table, read_bandwidth_gbs, write_csv, write_json

OURS, LLAMA = "MiniServe", "llama.cpp"
CLIENTS = 8
RESULT_PREFIX = "RESULT "


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.models --sizes", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", action="store_true", help=f"all default sizes: {', '.join(DEFAULT_SIZES)}")
    parser.add_argument("--size", nargs="+", default=[], help="these shapes only (bench.model_shapes.SHAPES)")
    parser.add_argument("--with-8b", action="store_true", help="also the Llama 3.1 8B shape (a long, large build)")
    parser.add_argument("--types", nargs="+", default=["Q4_K_M", "Q8_0"])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--tokens", type=int, default=64, help="new tokens per decode run")
    parser.add_argument("--b1-rounds", type=int, default=3,
                        help="batch 1 again in this many rounds of the sides taking turns (0: the main pass's only)")
    parser.add_argument("--llama-bin", default=os.environ.get("MINISERVE_LLAMA_BIN", "/work/llama-bin"),
                        help="llama.cpp's binaries and converter (scripts/build_llama_cpp.sh)")
    parser.add_argument("--cache-dir", default="", help="default: the settings' cache_dir")
    parser.add_argument("--ours-quant", nargs="+", default=["auto"], choices=["auto", "q8", "gguf"],
                        help="MINISERVE_QUANT of MiniServe's side; several: one side each (auto is 'MiniServe')")
    parser.add_argument("--skip-ours", action="store_true")
    parser.add_argument("--no-first-start", action="store_true",
                        help="measure MiniServe's start on the file's kept cache folder only (no first start)")
    parser.add_argument("--skip-llama", action="store_true")
    parser.add_argument("--note", default="", help="recorded in the results (a busy machine, say)")
    parser.add_argument("--out", default="results")
    args = parser.parse_args(argv)
    if not args.sizes and not args.size:
        parser.error("name the shapes: --sizes (all default ones) or --size NAME ...")
    return args


def ours_side(quant: str) -> str:
    """The side's name: ``MiniServe`` for the default setting, ``MiniServe gguf`` for another."""
    return OURS if quant == "auto" else f"{OURS} {quant}"


def sides_of(entry: dict[str, Any]) -> list[str]:
    """The sides measured on a file, ours first."""
    return [k for k in entry if k.startswith(OURS)] + ([LLAMA] if LLAMA in entry else [])


def run_ours(gguf: Path, args: argparse.Namespace, cache: Path, quant: str = "auto") -> dict[str, Any]:
    """A first start on an empty cache folder (load only), then a measured second start.

    The folder (``<cache>/sizes/.ours-<setting>-<file>``: the file's prepared weights, one per
    setting, since q8 prepares what gguf does not) is kept, so with ``--no-first-start`` a later
    run measures a second start at once; where it holds nothing yet, the measured start is a
    first one and says so (``start``)."""
    scratch = ours_cache(gguf, cache, quant)
    base, env = ours_command(gguf, args, cache, quant)
    first: dict[str, Any] = {}
    if not args.no_first_start:
        shutil.rmtree(scratch, ignore_errors=True)
        first = child(base + ["--load-only"], env)
    start = "second" if (scratch / "models").is_dir() else "first"
    out = {**child(base, env), "start": start}
    if first:
        out.update(first_ready_s=first["ready_s"], first_peak_load_mb=first["peak_load_mb"],
                   first_rss_after_load_mb=first["rss_after_load_mb"])
    return out


def ours_cache(gguf: Path, cache: Path, quant: str) -> Path:
    return cache / "sizes" / f".ours-{quant}-{gguf.stem}"


def ours_command(gguf: Path, args: argparse.Namespace, cache: Path, quant: str) -> tuple[list[str], dict[str, str]]:
    """The child's command line and environment for MiniServe's side with setting ``quant``."""
    command = [sys.executable, "-m", "bench.model_sizes_ours", "--gguf", str(gguf), "--cache-dir",
               str(ours_cache(gguf, cache, quant)), "--threads", str(args.threads), "--tokens", str(args.tokens),
               "--clients", str(CLIENTS)]
    return command, {**os.environ, "MINISERVE_QUANT": quant}


def child(command: list[str], env: dict[str, str] | None = None) -> dict[str, Any]:
    done = subprocess.run(command, capture_output=True, text=True, timeout=3600, env=env)
    line = next((l for l in done.stdout.splitlines() if l.startswith(RESULT_PREFIX)), None)
    if done.returncode != 0 or line is None:
        raise RuntimeError(f"{' '.join(command[2:4])} exited {done.returncode}: {done.stderr[-800:]}")
    return json.loads(line[len(RESULT_PREFIX):])


def previous_run(path: Path) -> dict[str, Any]:
    """What an earlier run wrote (empty when none): a partial run adds to it."""
    return json.loads(path.read_text()) if path.is_file() else {}


def carry(entry: dict[str, Any], old: dict[str, Any] | None, args: argparse.Namespace) -> None:
    """A side this run does not measure (skipped, or a setting not asked for this time) keeps its
    figures from the earlier run on the same file (said in ``carried``: that side was measured in
    another run, under that run's load)."""
    if not old or old.get("gguf") != entry["gguf"]:
        return
    measured = ([] if args.skip_ours else [ours_side(q) for q in args.ours_quant]) + ([] if args.skip_llama else [LLAMA])
    for side in sides_of(old):
        if side not in measured:
            entry[side] = old[side]
            entry.setdefault("carried", []).append(side)


def file_info(shape: ModelShape, quant: str, gguf: Path) -> dict[str, Any]:
    tb = token_bytes(read_tensors(gguf))
    return {"model": shape.name, "quant": quant, "params_b": round(param_count(shape) / 1e9, 3),
            "file_mb": round(gguf.stat().st_size / 1e6, 1), "mb_per_token": round(tb.per_token / 1e6, 1),
            "tied_embeddings": tb.tied, "gguf": gguf.name}


def add_floor(entry: dict[str, Any], bandwidth_gbs: float) -> None:
    """The file's floor at ``bandwidth_gbs``, and each side's batch-1 decode as a share of the
    floor at its own bandwidth samples (the better of them) where it has them."""
    token = int(entry["mb_per_token"] * 1e6)
    entry["floor_tps"] = round(floor_tps(bandwidth_gbs, token), 1)
    for side in sides_of(entry):
        s = entry[side]
        if "error" in s:
            continue
        if s.get("b1_rounds"):
            shares = [pct_of_floor(tps, floor_tps(max(samples), token))
                      for tps, samples in zip(s["b1_rounds"], s["b1_round_bandwidth_gbs"])]
            s["b1_pct_of_floor"] = round(statistics.median(x for x in shares if x is not None), 1)
        else:
            own = max(s.get("bandwidth_gbs") or [bandwidth_gbs])
            s["b1_pct_of_floor"] = pct_of_floor(s.get("b1_tps"), floor_tps(own, token))


def flat_rows(files: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One CSV row per file and side."""
    info = ("model", "quant", "params_b", "file_mb", "mb_per_token", "floor_tps")
    return [{**{k: f[k] for k in info}, "side": side, **{k: v for k, v in f[side].items() if k != "setting"},
             "setting": f[side].get("setting", "")} for f in files for side in sides_of(f)]


def measure_file(entry: dict[str, Any], gguf: Path, args: argparse.Namespace, cache: Path,
                 saved: Callable[[], None], samples: list[float]) -> None:
    """Each side not skipped, into ``entry``, ``saved`` after each; a side that fails records its
    error, and the run goes on. The read bandwidth is sampled right before and after each side
    (kept with the side, and added to ``samples``)."""
    from bench.model_sizes_llama import measure as llama_measure

    sides = {} if args.skip_ours else {ours_side(q): (lambda q=q: run_ours(gguf, args, cache, q))
                                       for q in args.ours_quant}
    if not args.skip_llama:
        sides[LLAMA] = lambda: llama_measure(Path(args.llama_bin), gguf, args.threads, args.tokens, CLIENTS)
    for side, measure in sides.items():
        before = read_bandwidth_gbs(mb=1024)
        try:
            entry[side] = measure()
        except (RuntimeError, subprocess.TimeoutExpired) as exc:
            entry[side] = {"error": str(exc)[-600:]}
            print(f"{entry['model']} {entry['quant']} {side} failed: {exc}", flush=True)
        entry[side]["bandwidth_gbs"] = [round(before, 2), round(read_bandwidth_gbs(mb=1024), 2)]
        samples += entry[side]["bandwidth_gbs"]
        saved()


def batch1_rounds(entry: dict[str, Any], gguf: Path, args: argparse.Namespace, cache: Path,
                  samples: list[float]) -> None:
    """Batch 1 of every side this run measured, again, the sides taking turns for
    ``args.b1_rounds`` rounds (the order flipped each round), each turn between two bandwidth
    samples. A side's ``b1_tps`` becomes the median of its rounds (``b1_rounds``; the main
    pass's figure is kept as ``b1_main_tps``). Nothing happens with fewer than two sides."""
    from bench.model_sizes_llama import text_generation

    turns: dict[str, Callable[[], float]] = {}
    for quant in [] if args.skip_ours else args.ours_quant:
        command, env = ours_command(gguf, args, cache, quant)
        turns[ours_side(quant)] = lambda command=command, env=env: child(command + ["--batch1-only"], env)["b1_tps"]
    if not args.skip_llama:
        turns[LLAMA] = lambda: text_generation(Path(args.llama_bin), gguf, args.threads, args.tokens)
    sides = [side for side in turns if "error" not in entry.get(side, {"error": "not measured"})]
    if args.b1_rounds <= 0 or len(sides) < 2:
        return
    rounds: dict[str, list[tuple[float, list[float]]]] = {side: [] for side in sides}
    for r in range(args.b1_rounds):
        for side in sides if r % 2 == 0 else sides[::-1]:
            before = round(read_bandwidth_gbs(mb=1024), 2)
            try:
                tps = turns[side]()
            except (RuntimeError, subprocess.TimeoutExpired) as exc:  # the main pass's figures stand
                entry["b1_rounds_error"] = f"{side}: {str(exc)[-400:]}"
                print(f"{entry['model']} {entry['quant']} batch-1 rounds stopped: {exc}", flush=True)
                return
            after = round(read_bandwidth_gbs(mb=1024), 2)
            samples += [before, after]
            rounds[side].append((round(tps, 2), [before, after]))
    for side, measured in rounds.items():
        s = entry[side]
        s["b1_main_tps"] = s.get("b1_tps")
        s["b1_rounds"] = [tps for tps, _ in measured]
        s["b1_round_bandwidth_gbs"] = [bw for _, bw in measured]
        s["b1_tps"] = round(statistics.median(s["b1_rounds"]), 2)


def main(argv: list[str] | None = None) -> int:
    import torch

    from bench.model_sizes_llama import version
    from core.settings import load_settings

    args = parse(argv)
    torch.set_num_threads(args.threads)
    cache = Path(args.cache_dir) if args.cache_dir else Path(load_settings().cache_dir)
    shapes = resolve(list(DEFAULT_SIZES) if args.sizes and not args.size else args.size, args.with_8b)
    out = Path(args.out)
    before = previous_run(out / "model_sizes.json")
    previous = {(f["model"], f["quant"]): f for f in before.get("files", [])}
    run = {"llama_cpp": before.get("llama_cpp", "") if args.skip_llama else version(Path(args.llama_bin)),
           "note": args.note, "bandwidth": [], "load": [round(os.getloadavg()[0], 1)]}
    files: list[dict[str, Any]] = []
    for shape in shapes:
        for quant, gguf in ensure_files(shape, args.types, Path(args.llama_bin), cache).items():
            entry = file_info(shape, quant, gguf)
            carry(entry, previous.pop((shape.name, quant), None), args)
            files.append(entry)

            def saved() -> None:
                add_floor(entry, statistics.median(run["bandwidth"] or [0.0]))
                write(out, args, files + list(previous.values()), run)
            measure_file(entry, gguf, args, cache, saved, run["bandwidth"])
            batch1_rounds(entry, gguf, args, cache, run["bandwidth"])
            saved()
            print(json.dumps(entry), flush=True)
    run["load"].append(round(os.getloadavg()[0], 1))
    for entry in files:
        add_floor(entry, statistics.median(run["bandwidth"] or [0.0]))
    files += previous.values()  # files this run did not ask for keep their earlier figures
    write(out, args, files, run)
    print_table(flat_rows(files), ["model", "quant", "side", "b1_tps", "b1_pct_of_floor", f"b{CLIENTS}_tps",
                                   "pp512_tps", "rss_after_load_mb", "peak_load_mb", "ready_s"])
    print(f"wrote {out}/model_sizes.json, model_sizes.csv")
    return 0


def write(out: Path, args: argparse.Namespace, files: list[dict[str, Any]], run: dict[str, Any]) -> None:
    files = sorted(files, key=lambda f: (f["params_b"], f["quant"]))
    machine = {**machine_info(), "read_bandwidth_gbs": [round(b, 2) for b in run["bandwidth"]],
               "load_average_1min": run["load"]}  # the other processes' share of the cores, start and end
    argv = [a for a in sys.argv[1:] if a not in ("--note", args.note)]
    write_json(out / "model_sizes.json", {"machine": machine, "command": " ".join(["python -m bench.models", *argv]),
                                          "args": vars(args), "llama_cpp": run["llama_cpp"], "note": run["note"],
                                          "clients": CLIENTS, "files": files,
                                          "ours_ready_after_first_token": True})
    write_csv(out / "model_sizes.csv", flat_rows(files))
