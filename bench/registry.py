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
              "How fast is each generation method, and does it produce the same tokens as transformers' `generate`?"),
    Benchmark("prefix_cache", "bench.prefix_cache",
              "How much sooner does a prompt start answering when its prefix is cached?"),
    Benchmark("paged_generation", "bench.paged_generation",
              "What does the paged cache cost in decode speed, and how much KV memory does prefix sharing save?"),
    Benchmark("batching", "bench.batching",
              "How much throughput do concurrent jobs gain from one batched engine, against one at a time and transformers?"),
    Benchmark("fairness", "bench.fairness",
              "While jobs of every other method run, how long does a `paged` job wait between two tokens?"),
    Benchmark("speculative", "bench.speculative",
              "What does the n-gram drafter gain where the answer copies the prompt, and what does it cost where it does not?"),
    Benchmark("quantization", "bench.quantization",
              "How fast are `q8` weights against bf16 and llama.cpp, how much memory do they take, and how often do they pick the same tokens?",
              children=("bench.quantization_memory", "bench.quantization_llamacpp", "bench.gguf_kernels")),
    Benchmark("models", "bench.models",
              "How fast does each bundled model decode at batch 1 and 8, full precision and `q8`, beside llama.cpp on the same GGUF file, "
              "and how do MiniServe and llama.cpp compare on GGUF files from 0.5B to 8B?",
              children=("bench.model_sizes_ours",)),
    Benchmark("constrained_overhead", "bench.constrained_overhead",
              "What does a JSON-schema grammar cost per token, alone and in a batch?"),
    Benchmark("embeddings", "bench.embeddings",
              "How many texts/s does the embedding model embed at batch 1 and 32, in-process and through `/v1/embeddings`, beside sentence-transformers? Does hybrid note retrieval help?"),
    Benchmark("evaluate_agent", "bench.evaluate_agent",
              "How often does the agent pick the right tool and reach the right answer on the evaluation cases?"),
    Benchmark("queue_overhead", "bench.queue_overhead",
              "How much latency do web, Redis and Celery add to a direct engine call?"),
    Benchmark("load", "bench.load",
              "Does the service lose, duplicate or fail jobs under 50 clients, and when a worker is killed? "
              "Does `/health` stay fast beside thousands of open streams?"),
    Benchmark("scale", "bench.scale",
              "How does throughput grow with worker processes, and how fast do a dead worker's jobs move?"),
    Benchmark("soak", "bench.soak",
              "Over minutes of mixed and hostile traffic with a worker killed and Redis down, is any job lost or any answer a 500? "
              "How long does a stream wait when its worker dies, and how much memory does a worker hold?"),
    Benchmark("report", "bench.report",
              "What do the results files say? Writes docs/benchmarks.md from them."),
)


def find(name: str) -> Benchmark | None:
    return next((b for b in BENCHMARKS if b.name == name), None)
