"""engine/'s import graph is acyclic and points down its layers, counting imports made inside
functions (an import that runs late still ties the two modules together).

Why a test: a cycle lets a change anywhere reach anywhere, and nothing stops one from
growing back. The walk (tests/import_graph.py) reads the source (no imports run): every ``import`` and
``from`` anywhere in a module, relative imports resolved, ``from package import name``
counted as an import of ``package.name`` when that is a module (and of ``package`` itself,
whose ``__init__`` runs).
"""
from __future__ import annotations

import ast
from pathlib import Path

from tests.import_graph import import_graph as graph_of
from tests.import_graph import imported, modules, strongly_connected

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = "engine"

# Bottom to top. A module belongs to the layer of the longest prefix that names it.
LAYERS = ("low-level operations", "model forward", "KV caches", "generation methods and scheduler", "loop")
# Packages whose __init__ imports nothing of engine: importing ``engine.ops.c_calls`` runs
# engine/__init__.py, so a re-exporting package would tie its modules into one cycle.
INERT_PACKAGES = ("engine", "engine.quant", "engine.ops")
LAYER_OF = {
    "engine.types": 0,
    "engine.errors": 0,                # ModelLoadError, raised by the loader and the architecture
    "engine.architecture": 1,          # the model description the forward is driven by
    "engine.openmp": 0,
    "engine.quant.native": 0,
    "engine.quant.q8": 0,
    "engine.quant.prefill_choice": 0,
    "engine.quant.kernels": 0,
    "engine.quant.mapped": 0,
    "engine.quant.interleaved_cache": 0,   # a GGUF's interleaved matrices in a mapped file
    "engine.quant.gguf_blocks": 0,     # GGUF block formats: the weight and its matmul
    "engine.quant.gguf_native": 0,     # their C kernels (native/gguf.c)
    "engine.quant.gguf_linear": 0,     # linears and the embedding over a GGUF's blocks
    "engine.gguf_index": 0,            # a GGUF's tensor table, read fast, its data mapped
    "engine.ops.interface": 0,         # the small operations' one interface
    "engine.ops.torch_ops": 0,         # torch's: the exact reference
    "engine.ops.c_calls": 0,           # one C call per operation (native/decode.c)
    "engine.ops.fused_ops": 0,         # the interface over those C calls
    "engine.ops.choose": 1,            # which of them a forward runs (reads the quantized weights)
    "engine.packed": 0,
    "engine.huge_pages": 0,            # weights placed in transparent huge pages
    "engine.quant.plan": 1,
    "engine.quant.layer": 1,
    "engine.quant.model": 1,
    "engine.quant.restore": 1,
    "engine.quant.weight_cache": 1,    # the quantized weights of an earlier start, on disk
    "engine.quant.source": 1,
    "engine.quant.step": 1,            # the one-call decode step of the whole model
    "engine.weights": 1,
    "engine.gguf_weights": 1,          # a quantized GGUF's weights for the forward, from the mapping
    "engine.gguf_model": 1,            # the meta transformers model of a native GGUF; official on demand
    "engine.loader": 1,
    "engine.gguf_meta": 0,
    "engine.prepare_gguf": 1,
    "engine.prepare_default": 1,
    "engine.embedding": 1,             # the embedding model: its files, encoder and pooling
    "engine.embedding.batcher": 4,     # the embedding worker's loop: one thread owns the model
    "engine.embedding.service": 4,     # the model and its loop, as the worker holds them
    "engine.forward": 1,
    "engine.kv_cache": 2,
    "engine.prefix_cache": 2,
    "engine.paged": 2,
    "engine.speculative.attention": 2,  # verify rows' attention over a cache
    "engine.paged.forward": 3,         # the batched forward over paged attention: the scheduler's
    "engine.sampling": 3,
    "engine.penalties": 3,             # OpenAI's presence/frequency penalties and logit_bias
    "engine.logprobs": 3,              # per-token log-probabilities, when asked
    "engine.prompt_logprobs": 3,       # the prompt's own tokens scored (echo with logprobs)
    "engine.prompt": 3,
    "engine.run": 3,
    "engine.textstream": 3,
    "engine.constrained": 3,
    "engine.speculative": 3,
    "engine.handwritten": 3,
    "engine.official": 3,
    "engine.official_processors": 3,
    "engine.batching": 3,
    "engine.loop": 4,
    "engine.solo": 4,
    "engine.group": 4,                 # one thread consuming a group of requests (n choices)                  # the loop's non-batched requests, resumed a token at a time
    "engine.model_engine": 4,          # the loaded model and its method table
    "engine.engine": 4,
    "engine.methods": 4,
}


def import_graph() -> dict[str, set[str]]:
    """module -> the engine modules it imports, anywhere in its body."""
    return graph_of(modules(ROOT, (PACKAGE,)))


def layer(module: str) -> int:
    """The module's layer (an inert package: the bottom, it imports nothing)."""
    if module in INERT_PACKAGES:
        return 0
    name = module
    while name not in LAYER_OF:
        name = name.rpartition(".")[0]
        if not name or name in INERT_PACKAGES:
            raise AssertionError(f"{module} has no layer: add it (or its package) to LAYER_OF")
    return LAYER_OF[name]


def test_the_walk_finds_a_cycle_and_resolves_relative_imports():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert strongly_connected(graph) == [["a", "b", "c"]]
    assert strongly_connected({"a": {"b"}, "b": set()}) == []
    tree = ast.parse("def f():\n    from ..kv_cache import NoCache\n    from . import pool\n")
    names = [n for node in ast.walk(tree) for n in imported(node, "engine.paged.forward", False)]
    assert "engine.kv_cache.NoCache" in names and "engine.paged.pool" in names


def test_engine_import_graph_has_no_cycle():
    cycles = strongly_connected(import_graph())
    assert not cycles, "import cycles in engine/ (counting imports inside functions): " + "; ".join(
        " <-> ".join(cycle) for cycle in cycles)


def test_inert_packages_import_nothing_of_engine():
    graph = import_graph()
    assert {package: sorted(graph[package]) for package in INERT_PACKAGES} == {p: [] for p in INERT_PACKAGES}


def test_every_engine_module_has_a_layer():
    for module in import_graph():
        layer(module)


def test_imports_point_down_the_layers():
    upward = [f"{module} ({LAYERS[layer(module)]}) imports {target} ({LAYERS[layer(target)]})"
              for module, targets in sorted(import_graph().items()) for target in sorted(targets)
              if layer(target) > layer(module)]
    assert not upward, "upward imports in engine/:\n" + "\n".join(upward)
