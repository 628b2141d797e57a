"""The rooms' import rules (docs/architecture.md, "Rooms"), checked over the whole tree.

Why a test: a rule that is only written down drifts; a function-local import that dodges a
cycle, or a helper borrowed from another room, ties two rooms together as surely as a top
import. The walk (tests/import_graph.py) reads every module's source, counting imports made
inside functions, and checks four things:

* each room imports only the rooms, and the third-party packages, its row allows;
* what the engine reaches, following our own imports to the end, holds no Celery, Flask or
  Redis; what the web reaches holds no engine, torch or transformers;
* no import cycle anywhere (bench/ included);
* no module imports another module's private (``_name``) helper.

The rules are data (``ROOMS``), so the table in docs/architecture.md and this file say the
same thing; ``check`` takes a root so a planted back-edge in a scratch tree proves it fails.
"""
from __future__ import annotations

import ast
import sys
from dataclasses import dataclass, field
from pathlib import Path

from tests.import_graph import imported, import_graph, modules, raw_imports, resolve, strongly_connected

ROOT = Path(__file__).resolve().parents[2]
WEB_STACK = ("flask", "flask_openapi3", "flask_openapi3_swagger", "werkzeug", "gunicorn", "gevent", "jinja2")
MODEL_STACK = ("torch", "transformers", "safetensors", "gguf", "numpy")
QUEUE_STACK = ("celery", "kombu", "redis")


@dataclass(frozen=True)
class Room:
    may_import: tuple[str, ...]                 # our rooms (a dotted name: that module or package only)
    third_party: tuple[str, ...] | None = None  # the only third-party packages allowed (None: any not refused)
    refused: tuple[str, ...] = ()               # third-party packages never imported
    never_reaches: tuple[str, ...] = ()         # names nothing it reaches (through our imports) may import
    notes: dict[str, str] = field(default_factory=dict)


ROOMS: dict[str, Room] = {
    "core": Room(("core",), third_party=("pydantic", "pydantic_settings", "redis", "tqdm")),
    "engine": Room(("engine", "core.settings", "core.logs", "core.prompt_block", "core.methods",
                    "core.sampling_fields", "core.grammar", "core.model_source", "core.prefix_hash",
                    "core.file_digest", "core.redis_url"),
                   refused=WEB_STACK + QUEUE_STACK, never_reaches=WEB_STACK + QUEUE_STACK),
    "tools": Room(("tools",), third_party=("jsonschema", "bm25s")),
    "agent": Room(("agent", "tools", "core", "engine.types"), refused=WEB_STACK + QUEUE_STACK + MODEL_STACK,
                  never_reaches=WEB_STACK + MODEL_STACK),
    "worker": Room(("worker", "core", "engine", "agent", "tools"), refused=WEB_STACK),
    "web": Room(("web", "core"), refused=MODEL_STACK, never_reaches=MODEL_STACK + ("engine",)),
    "bench": Room(("bench", "core", "engine", "tools", "agent", "worker", "web", "tests")),
}
# Known back-edges still to remove, each with its reason; the test fails when one is gone
# (remove it here) or a new one appears.
KNOWN: dict[str, str] = {}


def _allowed(target: str, room: Room) -> bool:
    return any(target == name or target.startswith(name + ".") for name in room.may_import)


def _third_party(name: str, ours: set[str]) -> str | None:
    top = name.split(".")[0]
    if not top or top in ours or top in sys.stdlib_module_names or top == "__future__":
        return None
    return top


def room_violations(root: Path, rooms: dict[str, Room]) -> list[str]:
    """Each import a room's row does not allow, as ``module imports name (why)``."""
    ours = set(rooms) | {"tests"}
    known = modules(root, tuple(rooms))
    found = []
    for module, names in sorted(raw_imports(known).items()):
        room = rooms[module.split(".")[0]]
        # ``from core import jobs`` names ``core`` too: the package counts as the module under it
        inner = {t for n in names if (t := resolve(n, known))}
        for name in sorted(names):
            if name in known and known[name].name == "__init__.py" and any(t.startswith(name + ".") for t in inner):
                continue
            package = _third_party(name, ours)
            if package is not None:
                if package in room.refused or (room.third_party is not None and package not in room.third_party):
                    found.append(f"{module} imports {package}")
                continue
            target = resolve(name, known) or name
            if target.split(".")[0] in ours and not _allowed(target, room):
                found.append(f"{module} imports {target}")
    return sorted(set(found))


def reach_violations(root: Path, rooms: dict[str, Room]) -> list[str]:
    """What each room reaches through our own imports, to the end, against its ``never_reaches``."""
    known = modules(root, tuple(rooms))
    graph, raw = import_graph(known), raw_imports(known)
    found = []
    for module in sorted(known):
        refused = rooms[module.split(".")[0]].never_reaches
        if not refused:
            continue
        seen, todo = {module}, [module]
        while todo:
            for target in graph[todo.pop()] - seen:
                seen.add(target)
                todo.append(target)
        for reached in sorted(seen):
            hits = {n.split(".")[0] for n in raw[reached]} | {reached.split(".")[0]}
            for name in sorted(hits & set(refused)):
                found.append(f"{module} reaches {name} (through {reached})")
    return found


def private_imports(root: Path, rooms: dict[str, Room]) -> list[str]:
    """``from our.module import _helper`` across modules: a helper shared is a public one."""
    known = modules(root, tuple(rooms))
    found = []
    for module, path in sorted(known.items()):
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if not isinstance(node, ast.ImportFrom):
                continue
            base = imported(node, module, path.name == "__init__.py")[0]
            if base.split(".")[0] not in rooms:
                continue
            found += [f"{module} imports {base}.{a.name}" for a in node.names
                      if a.name.startswith("_") and not a.name.startswith("__")]
    return found


def cycles(root: Path, rooms: dict[str, Room]) -> list[str]:
    return [" <-> ".join(cycle) for cycle in strongly_connected(import_graph(modules(root, tuple(rooms))))]


def check(root: Path, rooms: dict[str, Room] = ROOMS) -> list[str]:
    """Every broken rule under ``root``."""
    return (room_violations(root, rooms) + reach_violations(root, rooms)
            + [f"private: {p}" for p in private_imports(root, rooms)] + [f"cycle: {c}" for c in cycles(root, rooms)])


# ---------------------------------------------------------------- the checker fails when it must

def _tree(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


CLEAN = {
    "core/__init__.py": "", "core/settings.py": "import pydantic\n",
    "engine/__init__.py": "", "engine/run.py": "from core.settings import x\nimport torch\n",
    "tools/__init__.py": "", "agent/__init__.py": "", "worker/__init__.py": "",
    "web/__init__.py": "", "web/app.py": "import flask\nfrom core import settings\n",
    "bench/__init__.py": "", "bench/a.py": "from web.app import x\nfrom engine.run import y\n",
}


def test_the_scratch_tree_without_plants_is_clean(tmp_path):
    assert check(_tree(tmp_path, CLEAN)) == []


def test_a_planted_back_edge_inside_a_function_is_reported(tmp_path):
    root = _tree(tmp_path, {**CLEAN, "worker/batch.py": "def start():\n    from web.app import create_app\n"})
    assert check(root) == ["worker.batch imports web.app"]


def test_a_planted_third_party_import_and_what_it_reaches_are_reported(tmp_path):
    root = _tree(tmp_path, {**CLEAN, "core/settings.py": "import pydantic\n\ndef f():\n    import redis\n",
                            "core/jobs.py": "import redis\n", "engine/run.py": "from core import jobs\n"})
    assert check(root) == ["engine.run imports core.jobs", "engine.run reaches redis (through core.jobs)"]


def test_a_planted_cycle_and_a_private_helper_are_reported(tmp_path):
    root = _tree(tmp_path, {**CLEAN, "bench/b.py": "from bench.c import _helper\n",
                            "bench/c.py": "def _helper():\n    from bench import b\n"})
    assert check(root) == ["private: bench.b imports bench.c._helper", "cycle: bench.b <-> bench.c"]


def test_web_reaching_the_engine_through_core_is_reported(tmp_path):
    root = _tree(tmp_path, {**CLEAN, "core/bad.py": "from engine import run\n",
                            "web/app.py": "from core import bad\n"})
    found = check(root)
    assert "core.bad imports engine.run" in found and "web.app reaches engine (through engine.run)" in found
    assert "web.app reaches torch (through engine.run)" in found


# ---------------------------------------------------------------- the tree holds the rules

def test_every_top_level_package_has_a_room():
    packages = {p.parent.name for p in ROOT.glob("*/__init__.py")}
    assert packages - {"tests", "scripts"} <= set(ROOMS)


def test_the_rooms_hold_but_for_the_known_back_edges():
    found = check(ROOT)
    assert sorted(set(found) - set(KNOWN)) == [], "rooms broken:\n" + "\n".join(sorted(set(found) - set(KNOWN)))
    assert sorted(set(KNOWN) - set(found)) == [], "gone: remove from KNOWN: " + ", ".join(sorted(set(KNOWN) - set(found)))
