"""What the benchmark report's readers share: the :class:`Figures` one section shows, reading
results files, and formatting numbers and machines as the page prints them."""
from __future__ import annotations

import csv
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

Row = list[Any]


@dataclass
class Figures:
    """What one section shows: read from one benchmark's results files."""
    header: list[str]
    rows: list[Row]
    machine: dict[str, Any] = field(default_factory=dict)
    command: str | None = None  # as recorded in the file; the section's own command otherwise
    notes: list[str] = field(default_factory=list)
    headline: list[str] = field(default_factory=list)  # README bullets (markdown, no link)
    headline_machines: dict[str, dict[str, Any]] = field(default_factory=dict)  # bullet -> its run's machine, where not the table's
    tables: list[tuple[str, list[str], list[Row]]] = field(default_factory=list)  # extra tables

    def add_headline(self, text: str, machine: dict[str, Any] | None) -> None:
        """A README bullet measured in a run of its own (its machine, not the section table's)."""
        self.headline.append(text)
        if machine:
            self.headline_machines[text] = machine


def load_json(root: Path, name: str) -> dict[str, Any]:
    return json.loads((root / name).read_text())


def optional_json(root: Path, name: str) -> dict[str, Any]:
    """A file older runs did not write (their machine, say): empty when missing."""
    return load_json(root, name) if (root / name).is_file() else {}


def load_csv(root: Path, name: str) -> list[dict[str, str]]:
    with (root / name).open(newline="") as handle:
        return list(csv.DictReader(handle))


def num(value: Any, digits: int = 2) -> str:
    """A figure as the page prints it: fixed digits, '-' for missing or NaN."""
    if value is None or value == "":
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    try:
        number = float(value)
    except (TypeError, ValueError):
        return str(value)
    if number != number:  # NaN
        return "-"
    return f"{number:.{digits}f}"


def ratio(value: Any, digits: int = 2) -> str:
    text = num(value, digits)
    return text if text == "-" else f"{text}x"


def clean_command(command: str) -> str:
    """A recorded command without the interpreter's absolute path."""
    return re.sub(r"^\S*python3?\s", "python ", command.strip())


def machine_line(info: dict[str, Any]) -> str:
    """CPU model, cores, vector extensions, read bandwidth and torch, as far as recorded."""
    cpu = info.get("cpu_model") or info.get("cpu") or "CPU model not recorded"
    cores = info.get("cpus") or info.get("cpu_cores")
    parts = [str(cpu), f"{cores} cores" if cores else "cores not recorded"]
    if info.get("cpu_flags"):
        parts.append("flags " + " ".join(info["cpu_flags"]))
    bandwidth = info.get("read_bandwidth_gbs")
    if isinstance(bandwidth, list) and bandwidth:
        bandwidth = sum(bandwidth) / len(bandwidth)
    if bandwidth:
        parts.append(f"read bandwidth {num(bandwidth, 1)} GB/s")
    if info.get("torch"):
        threads = info.get("torch_threads")
        parts.append(f"torch {info['torch']}" + (f" with {threads} threads" if threads else ""))
    return ", ".join(parts)


def machine_kind(info: dict[str, Any]) -> str:
    """The short form for the README: CPU model and cores, as far as recorded."""
    cores = info.get("cpus") or info.get("cpu_cores")
    model = info.get("cpu_model") or info.get("cpu")
    if model:
        return f"{model}, {cores} cores" if cores else str(model)
    return f"a {cores}-core CPU, model not recorded" if cores else "machine not recorded"


def table(header: list[str], rows: list[Row]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    return lines + ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows]
