"""The benchmarks a user runs, each with the question it answers: the one list behind
``python -m bench``, so a new benchmark is one entry here and an experiment cannot hide in
bench/ (tests/unit/test_bench_registry.py fails on a runnable module that is not listed)."""
from __future__ import annotations

import importlib
import importlib.util
from dataclasses import dataclass
from types import ModuleType


@dataclass(frozen=True)
class Benchmark:
    name: str                       # python -m bench NAME
    module: str                     # the module whose main() runs it
    question: str                   # what a user learns from it, one line
    children: tuple[str, ...] = ()  # modules it starts as child processes (python -m CHILD)

    def available(self) -> bool:
        """Whether the module is on this checkout (listing never imports it)."""
        return importlib.util.find_spec(self.module) is not None

    def load(self) -> ModuleType:
        return importlib.import_module(self.module)


BENCHMARKS: tuple[Benchmark, ...] = (
    Benchmark("compare_generation", "bench.compare_generation",
              "What does each generation method (official, no_cache, custom_cache) cost per token?"),
    Benchmark("prefix_cache", "bench.prefix_cache",
              "How much time to first token does a prefix-cache hit save over a miss and official?"),
    Benchmark("paged_generation", "bench.paged_generation",
              "Is paged as fast as custom_cache, and how much KV memory do blocks and prefix sharing save?"),
    Benchmark("batching", "bench.batching",
              "How many tokens/s do N concurrent jobs get on one engine, against one at a time and transformers?"),
    Benchmark("fairness", "bench.fairness",
              "How long does a paged stream stall while jobs of every other method run beside it?"),
    Benchmark("speculative", "bench.speculative",
              "How much faster is prompt-lookup speculative decoding, on copy-heavy and on ordinary prompts?"),
    Benchmark("quantization", "bench.quantization",
              "What does each MINISERVE_QUANT setting give in speed, memory and agreement, against llama.cpp?",
              children=("bench.quantization_memory", "bench.quantization_llamacpp")),
    Benchmark("constrained_overhead", "bench.constrained_overhead",
              "What does a grammar's token mask cost per token, alone and in a mixed batch?"),
    Benchmark("evaluate_agent", "bench.evaluate_agent",
              "How often does the agent choose the right tool and give the right answer?"),
    Benchmark("queue_overhead", "bench.queue_overhead",
              "What does web -> Redis -> Celery add over calling the engine, and is any job lost?"),
    Benchmark("load", "bench.load",
              "Do many concurrent clients get every job exactly once, and at what latency?"),
    Benchmark("scale", "bench.scale",
              "What do more workers, cache-aware routing and a worker dying do to throughput?"),
    Benchmark("soak", "bench.soak",
              "Over minutes of hostile load, a worker kill and a Redis outage, is any job lost or run twice?"),
    Benchmark("report", "bench.report",
              "What do the results files say? Writes docs/benchmarks.md from them."),
)


def find(name: str) -> Benchmark | None:
    return next((b for b in BENCHMARKS if b.name == name), None)
