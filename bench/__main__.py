"""``python -m bench`` lists the benchmarks; ``python -m bench NAME [args]`` runs one.

The arguments after NAME go to that benchmark's own parser (``python -m bench NAME --help``),
exactly as ``python -m bench.MODULE [args]`` would get them."""
from __future__ import annotations

import sys

from bench.registry import BENCHMARKS, find


def listing() -> str:
    width = max(len(b.name) for b in BENCHMARKS)
    lines = ["usage: python -m bench NAME [args]   (NAME --help for its options)", ""]
    for bench in BENCHMARKS:
        missing = "" if bench.available() else "  [not on this checkout]"
        lines.append(f"  {bench.name.ljust(width)}  {bench.question}{missing}")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help", "list"):
        print(listing())
        return 0
    bench = find(argv[0])
    if bench is None:
        print(f"unknown benchmark {argv[0]!r}\n\n{listing()}", file=sys.stderr)
        return 2
    if not bench.available():
        print(f"benchmark {bench.name!r}: module {bench.module} is not on this checkout", file=sys.stderr)
        return 2
    sys.argv = [f"python -m bench {bench.name}", *argv[1:]]  # what the benchmark's parser reads
    code = bench.load().main()
    return code if isinstance(code, int) else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
