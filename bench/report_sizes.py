"""The report's reader for ``python -m bench.models --sizes`` (results/model_sizes.json): MiniServe
beside llama.cpp on GGUF files of several model sizes, shown as tables of the bundled models' section."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from bench.report_figures import Figures, Row, load_json, machine_line, num, ratio

SIZES = "results/model_sizes.json"
# the same benchmark on other hosts (`--out results/avx2`, `--out results/xeon`): each host's tables
# follow the main ones, under the name that tells its CPU apart
# (its tables' lead, its notes' lead)
OTHER_HOSTS = (("results/avx2/model_sizes.json", "On a host without AVX-512: ", "Sizes on the host without AVX-512"),
               ("results/xeon/model_sizes.json", "On an Intel Xeon host: ",
                "Sizes on the Intel Xeon host"))
OURS, LLAMA = "MiniServe", "llama.cpp"


def _sides(f: dict[str, Any]) -> list[str]:
    """A file's measured sides, ours first (``MiniServe``, or one per setting: ``MiniServe gguf``)."""
    return [k for k in f if k.startswith(OURS)] + ([LLAMA] if LLAMA in f else [])


def _share(a: Any, b: Any) -> str:
    return ratio(float(a) / float(b)) if a not in (None, "") and b not in (None, "", 0) else "-"


def side_rows(data: dict[str, Any]) -> list[Row]:
    clients = data.get("clients", 8)
    rows = []
    for f in data["files"]:
        for side in _sides(f):
            s = f[side]
            first = (f" (first start {num(s['first_ready_s'], 1)} s)" if "first_ready_s" in s
                     else " (a first start)" if s.get("start") == "first" else "")
            first_peak = (f" (first start {num(s['first_peak_load_mb'], 0)})" if "first_peak_load_mb" in s else "")
            runtime = f" ({num(s['rss_runtime_mb'], 0)} before the model)" if "rss_runtime_mb" in s else ""
            rows.append([f["model"], f["quant"], num(f["file_mb"], 0), side, num(s.get("b1_tps"), 1),
                         num(s.get("b1_pct_of_floor"), 0), num(s.get(f"b{clients}_tps"), 1), num(s.get("pp512_tps"), 1),
                         num(s.get("rss_after_load_mb"), 0) + runtime, num(s.get("peak_load_mb"), 0) + first_peak,
                         num(s.get("ready_s"), 1) + first])
    return rows


def ratio_rows(data: dict[str, Any]) -> list[Row]:
    clients = data.get("clients", 8)
    rows = []
    for f in data["files"]:
        llama = f.get(LLAMA)
        for side in [s for s in _sides(f) if s != LLAMA and llama]:
            ours = f[side]
            rows.append([f["model"], f["quant"], side, num(f["mb_per_token"], 0), num(f["floor_tps"], 1),
                         _share(ours.get("b1_tps"), llama.get("b1_tps")),
                         _share(ours.get(f"b{clients}_tps"), llama.get(f"b{clients}_tps")),
                         _share(ours.get("pp512_tps"), llama.get("pp512_tps")),
                         _share(ours.get("rss_after_load_mb"), llama.get("rss_after_load_mb")),
                         _share(ours.get("peak_load_mb"), f["file_mb"])])
    return rows


def add_sizes(figures: Figures, root: Path) -> None:
    """The sizes' tables and notes, appended to ``figures`` when the results file exists; then
    each other host's tables, where its file exists."""
    main: dict[str, Any] = {}
    if (root / SIZES).is_file():
        main = load_json(root, SIZES)
        _add_tables(figures, main, "")
        _add_notes(figures, main)
    for path, table_lead, host in OTHER_HOSTS:
        if (root / path).is_file():
            _add_other_host(figures, load_json(root, path), table_lead, host, main)


def _add_other_host(figures: Figures, second: dict[str, Any], table_lead: str, host: str,
                    main: dict[str, Any]) -> None:
    """Another host's tables, and the notes that differ from the main run's."""
    _add_tables(figures, second, table_lead)
    if second.get("ours_ready_after_first_token") and not main.get("ours_ready_after_first_token"):
        figures.notes.append(
            f"{host}: MiniServe's RSS after load is `VmRSS` after the load and a first token (mapped weights are "
            "resident once read, as llama-server's are after the token it decodes before it reports healthy), "
            "its peak while loading `VmHWM` of the load alone, before that token: so the peak can be the smaller.")
    _add_runtime_note(figures, second, f"{host}: ")
    _add_file_notes(figures, second, f"{host}: ")
    if second.get("note"):
        figures.notes.append(f"{host}, run note: {second['note']}")


def _add_tables(figures: Figures, data: dict[str, Any], host: str) -> None:
    clients = data.get("clients", 8)
    figures.tables.append((
        f"{host}GGUF files of several model sizes, random weights with the real shapes (`{data.get('command', '')}`; "
        f"{machine_line(data['machine'])})",
        ["model", "type", "file MB", "side", "decode tok/s, batch 1", "% of floor", f"tok/s, {clients} clients",
         "pp512 tok/s", "RSS after load MB", "peak while loading MB", "ready s"], side_rows(data)))
    figures.tables.append((
        f"{host}MiniServe against llama.cpp on the same file (batch 1 against `llama-bench` tg, "
        f"{clients} clients against `llama-server` with {clients} slots, pp512 against `llama-bench` pp512)",
        ["model", "type", "side", "MB read per token", "floor tok/s", "batch 1", f"{clients} clients", "pp512",
         "RSS after load", "peak while loading / file"], ratio_rows(data)))


def _add_notes(figures: Figures, data: dict[str, Any]) -> None:
    clients = data.get("clients", 8)
    bandwidth = data["machine"].get("read_bandwidth_gbs", [])
    warmed = (" and a first token, as llama-server decodes one before it reports healthy"
              if data.get("ours_ready_after_first_token") else "")
    peak_of = " of the load alone" if warmed else ""
    figures.notes.append(
        "Sizes: the floor is the read bandwidth over the bytes a batch-1 token reads: every tensor as stored, "
        "the embedding table's one row unless it is also the output matrix (tied), KV cache left out. The bandwidth "
        "drifts on a shared host, so it is sampled right before and after each side's measurement: a side's % of "
        "the floor uses the better of its own two samples, the floor column the median of the run's "
        f"({', '.join(num(b, 1) for b in bandwidth)} GB/s). MiniServe's memory is its worker "
        f"process's own (`VmRSS` after the load{warmed}, `VmHWM` for the peak{peak_of}) with a paged pool of llama-server's "
        f"context ({clients} x 1,024 tokens); its ready time is a second start{warmed}, the first start (the file's one-time "
        "preparation included, on an empty cache folder) in brackets. llama-server's ready time runs to `/health` "
        f"answering. {data.get('llama_cpp', '')}.")
    rounds = sorted({len(f[side]["b1_rounds"]) for f in data["files"] for side in _sides(f)
                     if f[side].get("b1_rounds")})
    if rounds:
        figures.notes.append(
            f"Sizes: batch 1 was measured again in {' or '.join(str(n) for n in rounds)} rounds in which the sides "
            "took turns, seconds apart, the order flipped each round (a MiniServe start timing batch 1 only, then "
            "`llama-bench` tg only): a side's batch-1 figure is the median of its rounds and its % of floor the "
            "median of each round's share at that round's own bandwidth samples.")
    if any(f[side].get(f"b{clients}_rounds") for f in data["files"] for side in _sides(f)):
        figures.notes.append(f"Sizes: {clients} clients is each side's median of 3 rounds after a warm one.")
    _add_runtime_note(figures, data, "Sizes: ")
    _add_file_notes(figures, data, "Sizes: ")
    load = data["machine"].get("load_average_1min")
    if data.get("note") or load:
        figures.notes.append(f"Sizes run note: {data.get('note', '')}"
                             + (f" (1-minute load average {', '.join(num(x, 1) for x in load)} at the start and end)."
                                if load else ""))
    best = _headline_file(data)
    if best:
        f, side = best
        ours, llama = f[side], f[LLAMA]
        figures.add_headline(
            f"Model sizes: on the {f['model']} shape at {f['quant']}, MiniServe "
            f"({ours.get('setting', 'auto')}) decodes {num(ours['b1_tps'], 1)} tok/s "
            f"at batch 1 ({_floor_share(ours.get('b1_pct_of_floor'))}), "
            f"{_share(ours['b1_tps'], llama['b1_tps'])} llama-bench; {clients} clients "
            f"{_share(ours.get(f'b{clients}_tps'), llama.get(f'b{clients}_tps'))} "
            f"{llama.get('batch_via', 'llama-server').split(' ')[0]}", data["machine"])


def _add_runtime_note(figures: Figures, data: dict[str, Any], lead: str) -> None:
    """What the bracketed RSS is, where the run measured it."""
    if any("rss_runtime_mb" in f[side] for f in data["files"] for side in _sides(f)):
        figures.notes.append(
            f"{lead}in brackets beside MiniServe's RSS after load, its RSS before it opens the model: Python, "
            "torch, transformers' tokenizer and config classes and the engine, imported. Every worker holds "
            "that whatever its model, so it weighs most on the smallest file; llama-server's runtime is its binary.")


def _add_file_notes(figures: Figures, data: dict[str, Any], lead: str) -> None:
    """What a file's rows do not say: stopped rounds, figures carried from another run, failures."""
    clients = data.get("clients", 8)
    for f in data["files"]:
        if f.get("b1_rounds_error"):
            figures.notes.append(f"{lead}the batch-1 rounds on {f['model']} {f['quant']} stopped "
                                 f"({f['b1_rounds_error'].strip().splitlines()[-1][:200]}); its batch 1 is the main pass's.")
        if f.get("carried"):
            figures.notes.append(f"{lead}the {' and '.join(f['carried'])} figures of {f['model']} {f['quant']} "
                                 "were measured in a separate run.")
        via = f.get(LLAMA, {}).get("batch_via", "llama-server")
        if via != "llama-server":
            figures.notes.append(f"{lead}llama.cpp's {clients} sequences on {f['model']} {f['quant']} ran through {via}.")
        for side in _sides(f):
            if f[side].get("error"):
                figures.notes.append(f"{lead}{side} failed on {f['model']} {f['quant']}: "
                                     f"{f[side]['error'].strip().splitlines()[-1][:200]}")


def _floor_share(pct: float | None) -> str:
    """A side's share of the bandwidth floor, said plainly where drift put it above 100%."""
    if pct is not None and pct > 100:
        return f"{num(pct, 0)}% of the floor its bandwidth samples give: the host's bandwidth drifted"
    return f"{num(pct, 0)}% of the bandwidth floor"


def _headline_file(data: dict[str, Any]) -> tuple[dict[str, Any], str] | None:
    """The largest Q4_K_M file both sides measured (Q4_K_M is the type people run), and our side
    shown: the default one, else the native one (``auto``'s choice for the K-format files shown)."""
    def ours(f: dict[str, Any]) -> str:
        return next((s for s in (OURS, f"{OURS} gguf") if s in f), next((s for s in _sides(f) if s != LLAMA), ""))

    both = [f for f in data["files"] if f.get(ours(f), {}).get("b1_tps") and f.get(LLAMA, {}).get("b1_tps")]
    both.sort(key=lambda f: (f["quant"] == "Q4_K_M", f["params_b"]))
    return (both[-1], ours(both[-1])) if both else None
