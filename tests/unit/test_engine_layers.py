"""engine/'s import graph is acyclic and points down its layers, counting imports made inside
functions (an import that runs late still ties the two modules together).

Why a test: a cycle lets a change anywhere reach anywhere, and nothing stops one from
growing back. The walk reads the source (no imports run): every ``import`` and ``from``
anywhere in a module, relative imports resolved, ``from package import name`` counted as an
import of ``package.name`` when that is a module (and of ``package`` itself, whose
``__init__`` runs).
"""
from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

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
    "engine.quant.gguf_blocks": 0,     # GGUF block formats: the weight and its matmul
    "engine.quant.gguf_linear": 0,     # linears and the embedding over a GGUF's blocks
    "engine.gguf_index": 0,            # a GGUF's tensor table, read fast, its data mapped
    "engine.ops.interface": 0,         # the small operations' one interface
    "engine.ops.torch_ops": 0,         # torch's: the exact reference
    "engine.ops.c_calls": 0,           # one C call per operation (native/decode.c)
    "engine.ops.fused_ops": 0,         # the interface over those C calls
    "engine.ops.choose": 1,            # which of them a forward runs (reads the quantized weights)
    "engine.packed": 0,
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


def modules() -> dict[str, Path]:
    found = {}
    for path in sorted((ROOT / PACKAGE).rglob("*.py")):
        name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
        found[name.removesuffix(".__init__")] = path
    return found


def _imported(node: ast.AST, module: str, is_package: bool) -> list[str]:
    """Dotted names an import node may load (resolved against ``module``)."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if not isinstance(node, ast.ImportFrom):
        return []
    base = node.module or ""
    if node.level:
        parts = module.split(".") if is_package else module.split(".")[:-1]
        parts = parts[: len(parts) - node.level + 1]
        base = ".".join(parts + ([base] if base else []))
    return [base] + [f"{base}.{alias.name}" for alias in node.names]


def import_graph() -> dict[str, set[str]]:
    """module -> the engine modules it imports, anywhere in its body."""
    known = modules()
    graph: dict[str, set[str]] = defaultdict(set)
    for module, path in known.items():
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            for name in _imported(node, module, path.name == "__init__.py"):
                while name and name not in known:          # a name inside a module: the module
                    name = name.rpartition(".")[0]
                if name and name != module:
                    graph[module].add(name)
        graph.setdefault(module, set())
    return graph


def strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's components with more than one module (iterative: no recursion limit)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


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
    names = [n for node in ast.walk(tree) for n in _imported(node, "engine.paged.forward", False)]
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
