"""What a second OpenMP thread team costs the engine loop: ``python -m bench.openmp_teams``.

libgomp keeps a team of worker threads per thread that opens parallel regions, and stops
spinning between regions once the process has more OpenMP threads than CPUs (engine/openmp.py).
This measures batch-1 decode through the engine loop (``custom_cache``, greedy, the same prompt)
with a helper thread that holds a team of its own (as the thread that loaded the model used to)
against the same helper after it released its team, interleaved, per quantization setting.
Writes ``results/openmp_teams.{json,csv,png}``.
"""
from __future__ import annotations

import argparse
import queue
import statistics
import threading
from pathlib import Path
from typing import Any, Callable

import torch

from bench.stats import cpu_model, finish_plot, machine_info, read_bandwidth_gbs, write_csv, write_json
from core.settings import load_settings
from engine.engine import Engine
from engine.openmp import release_thread_team
from engine.types import GenerationRequest, SamplingParams

PROMPT = "Write a Python function that sorts a list of dicts by a key, with a docstring."


class Helper:
    """A live thread that runs what it is given (here: one parallel op, or a release)."""

    def __init__(self) -> None:
        self.inbox: queue.Queue[Callable[[], Any]] = queue.Queue()
        self.outbox: queue.Queue[Any] = queue.Queue()
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self) -> None:
        while True:
            self.outbox.put(self.inbox.get()())

    def do(self, fn: Callable[[], Any]) -> Any:
        self.inbox.put(fn)
        return self.outbox.get()


def decode_rate(engine: Engine, tokens: int) -> float:
    request = GenerationRequest(messages=[{"role": "user", "content": PROMPT}], method="custom_cache",
                                sampling=SamplingParams(max_new_tokens=tokens, repetition_penalty=1.0))
    return engine.generate(request).timings.decode_tokens_per_s


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quant", default="none,q8")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=48)
    parser.add_argument("--out", default="results")
    args = parser.parse_args(argv)
    helper = Helper()
    rows, summary = [], {}
    bandwidth = read_bandwidth_gbs()
    for quant in args.quant.split(","):
        engine = Engine(load_settings(quant=quant)).load()
        decode_rate(engine, 8)                                        # warm up
        rates: dict[str, list[float]] = {"second_team": [], "one_team": []}
        for round_ in range(args.rounds):
            order = ("second_team", "one_team") if round_ % 2 == 0 else ("one_team", "second_team")
            for case in order:
                if case == "second_team":
                    helper.do(lambda: torch.ones(8_000_000).mul_(2.0))  # a parallel region: a team
                else:
                    helper.do(release_thread_team)
                rate = decode_rate(engine, args.tokens)
                rates[case].append(rate)
                rows.append({"quant": quant, "case": case, "round": round_, "decode_tok_s": round(rate, 2)})
                print(f"[{quant}] round {round_} {case}: {rate:.1f} tok/s", flush=True)
        helper.do(release_thread_team)
        engine.close()
        one, two = statistics.median(rates["one_team"]), statistics.median(rates["second_team"])
        summary[quant] = {"one_team_tok_s": round(one, 2), "second_team_tok_s": round(two, 2),
                          "x": round(one / two, 3)}
        print(f"[{quant}] one team {one:.1f} tok/s, with a second team {two:.1f} tok/s: {one / two:.2f}x")
    out = Path(args.out)
    machine = {**machine_info(), "cpu_model": cpu_model(), "read_bandwidth_gbs": bandwidth,
               "command": "python -m bench.openmp_teams " + " ".join(argv or [])}
    write_json(out / "openmp_teams.json", {"machine": machine, "summary": summary, "rows": rows})
    write_csv(out / "openmp_teams.csv", rows)
    plot(summary, out / "openmp_teams.png")
    print(f"wrote {out}/openmp_teams.json, .csv, .png")
    return 0


def plot(summary: dict[str, dict[str, float]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(summary)
    x = range(len(names))
    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.bar([i - 0.2 for i in x], [summary[n]["second_team_tok_s"] for n in names], 0.4, label="a second OpenMP team alive")
    ax.bar([i + 0.2 for i in x], [summary[n]["one_team_tok_s"] for n in names], 0.4, label="only the loop's team")
    ax.set_xticks(list(x), names)
    ax.set_ylabel("decode tok/s, batch 1, via the engine loop")
    finish_plot(fig, ax, path)


if __name__ == "__main__":
    raise SystemExit(main())
