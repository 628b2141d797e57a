"""The agent's tools cannot reach the file system or run code (issue 8, item 4).

tests/tools/ checks the calculator's whitelist and budgets case by case; here the same
question is asked the hard way: hostile inputs through the registry (as the agent calls
tools), and a subprocess with a Python audit hook that records every file open, exec,
process spawn or socket connect while the tools run.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.harness.bounded import returns
from tools import create_default_registry
from tools.retriever import NOTES_PATH, load_notes

ROOT = Path(__file__).resolve().parents[2]
HOSTILE_EXPRESSIONS = [
    "__import__('os').system('touch /tmp/miniserve-pwned')",
    "__import__('os')",
    "open('/etc/passwd').read()",
    "().__class__.__bases__[0].__subclasses__()",
    "(1).__class__",
    "(1).real",
    "os",
    "x",
    "__builtins__",
    "globals()",
    "eval('1+1')",
    "exec('import os')",
    "import os",
    "1; import os",
    "lambda: 1",
    "(lambda: 1)()",
    "f'{1+1}'",
    "f'{__import__(\"os\").getcwd()}'",
    "'1' + '1'",
    "b'1'",
    "[i for i in range(10)]",
    "{1: 2}",
    "1 if 1 else 2",
    "(y := 5)",
    "1j * 2",
    "None",
    "...",
    "1 .__add__(2)",
    "2 ** 10 ** 10 ** 10",
    "9" * 100_000,
    "1+" * 500_000 + "1",
    "(" * 1_000_000,
    "\x00",
    "1\n+__import__('os')",
]
HOSTILE_QUERIES = ["/etc/passwd", "../../../../etc/passwd", "file:///etc/shadow", str(NOTES_PATH),
                   "__import__('os').listdir('/')", "{{7*7}} ${7*7} %s%s%s", "x" * 1_000_000]


@pytest.fixture(scope="module")
def registry():
    return create_default_registry()


@pytest.mark.parametrize("expression", HOSTILE_EXPRESSIONS, ids=lambda e: repr(e[:40]))
def test_calculator_refuses_code_names_attributes_and_huge_inputs(registry, expression):
    result = returns(lambda: registry.execute("calculator", {"expression": expression}))  # 30 s net
    assert not result.success and result.error  # refused (the budgets: tests/tools/test_calculator.py)
    assert not Path("/tmp/miniserve-pwned").exists()


def test_retriever_reads_only_its_notes(registry):
    titles = {note.title for note in load_notes()}
    for query in HOSTILE_QUERIES:
        result = registry.execute("retrieve_note", {"query": query})
        if result.success:
            found = json.loads(result.content)["notes"]
            assert {hit["title"] for hit in found} <= titles
            assert "root:" not in result.content
    # No argument can point it anywhere else: the schema is closed and has no path.
    schema = registry.get("retrieve_note").parameters
    assert set(schema["properties"]) == {"query", "top_k"} and schema["additionalProperties"] is False
    for extra in ({"query": "kv cache", "path": "/etc/passwd"}, {"query": "kv cache", "file": "x"}):
        assert registry.execute("retrieve_note", extra).error_kind == "invalid_arguments"


def test_only_the_two_tools_exist(registry):
    assert sorted(registry.names) == ["calculator", "retrieve_note"]
    for name in ("eval", "exec", "os.system", "__import__", "open", "python", "shell"):
        assert registry.execute(name, {"expression": "1"}).error_kind == "unknown_tool"


AUDIT_SCRIPT = r"""
import json, sys
from tools import create_default_registry
registry = create_default_registry()            # reads data/notes.json here, once
registry.execute("calculator", {"expression": "1+1"})          # warm-up: lazy imports happen now
registry.execute("retrieve_note", {"query": "kv cache"})
FORBIDDEN = ("open", "exec", "os.system", "os.exec", "os.posix_spawn", "os.spawn", "os.fork",
             "subprocess.Popen", "socket.connect", "os.listdir", "os.scandir", "os.remove", "os.rename",
             "os.mkdir", "os.chdir", "shutil.", "ctypes.", "import")
seen = []
def hook(event, args):
    if event.startswith(FORBIDDEN):
        seen.append([event, repr(args)[:120]])
sys.addaudithook(hook)
for expression in json.loads(sys.argv[1]):
    registry.execute("calculator", {"expression": expression})
for query in json.loads(sys.argv[2]):
    registry.execute("retrieve_note", {"query": query})
    registry.execute("retrieve_note", {"query": query, "top_k": 3})
sys.stdout.write(json.dumps(seen))
"""


def test_audit_hook_sees_no_file_exec_process_or_socket_while_tools_run():
    expressions = [e for e in HOSTILE_EXPRESSIONS if len(e) < 1000] + ["(48 + 12) / 5", "2 ** 100"]
    queries = [q for q in HOSTILE_QUERIES if len(q) < 1000] + ["What is a KV cache?", "旋转位置编码"]
    done = subprocess.run([sys.executable, "-c", AUDIT_SCRIPT, json.dumps(expressions), json.dumps(queries)],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout) == []
