"""Write docs/benchmarks.md and the README's figures block from the results files.

The page is generated so that no figure drifts by hand: each section reads the files one
benchmark writes under results/ (JSON where it writes JSON, its CSV otherwise), and says the
question, the command, the machine, a table of headline figures and the plot. The output
depends only on those files (no time of generation), so a test can compare the committed
page with a fresh one.

    python -m bench.report            # rewrite docs/benchmarks.md and the README block
    python -m bench.report --check    # exit 1 if either differs from what it would write
"""
from __future__ import annotations

import argparse
import csv
import json
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parent.parent
PAGE = Path("docs/benchmarks.md")
README = Path("README.md")
START, END = "<!-- figures:start -->", "<!-- figures:end -->"
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


@dataclass(frozen=True)
class Section:
    name: str
    title: str
    question: str
    command: str
    files: tuple[str, ...]  # the first one must exist, or the section says "not run yet"
    read: Callable[[Path], Figures]
    pngs: tuple[str, ...] = ()


# ---------------------------------------------------------------- reading and formatting

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


# ---------------------------------------------------------------- one reader per benchmark

def read_batching(root: Path) -> Figures:
    rows = load_csv(root, "results/batching.csv")
    modes = list(dict.fromkeys(r["mode"] for r in rows))
    by = {(r["concurrency"], r["mode"]): r for r in rows}
    levels = list(dict.fromkeys(r["concurrency"] for r in rows))
    out = [[n, *(num(by[(n, m)]["tok_per_s"], 1) if (n, m) in by else "-" for m in modes),
            ratio(float(by[(n, "batched")]["tok_per_s"]) / float(by[(n, "sequential")]["tok_per_s"]))]
           for n in levels]
    top = levels[-1]
    best = by[(top, "batched")]
    figures = Figures(["concurrent jobs", *(f"{m} tok/s" for m in modes), "batched vs sequential"], out,
                      optional_json(root, "results/batching.machine.json"))
    figures.notes.append("Aggregate tokens/s (prefill included), median of interleaved rounds.")
    figures.headline.append(
        f"Continuous batching: {top} concurrent jobs on one engine give {num(best['tok_per_s'], 1)} tok/s, "
        f"{out[-1][-1]} one-at-a-time and {ratio(best['x_hf_cb'])} transformers' own continuous batching")
    return figures


def read_compare_generation(root: Path) -> Figures:
    rows: list[Row] = []
    machine: dict[str, Any] = {}
    for dtype in ("bfloat16", "float32"):
        stem = f"results/compare_generation_{dtype}"
        machine = machine or load_json(root, f"{stem}.machine.json")
        for r in load_csv(root, f"{stem}.summary.csv"):
            rows.append([dtype, r["new_tokens"], r["method"], num(r["p50_decode_tok_s"], 1),
                         ratio(r["decode_vs_official"]), num(r["p50_ttft_ms"], 0), r["identical_to_official"]])
    figures = Figures(["dtype", "new tokens", "method", "p50 decode tok/s", "vs official", "p50 TTFT ms",
                       "same tokens as official"], rows, machine)
    longest = [r for r in rows if r[0] == "bfloat16" and r[1] == max(x[1] for x in rows)]
    speeds = ", ".join(f"`{r[2]}` {r[4]}" for r in longest if r[2] != "official")
    figures.headline.append(f"Generation methods, bf16, {longest[0][1]} new tokens, decode speed against "
                            f"`official` (transformers `generate`): {speeds}")
    return figures


def read_prefix_cache(root: Path) -> Figures:
    rows = [[r["prefix"], r["case"], r["prompt_tokens"], r["cached_tokens"], num(r["p50_ttft_ms"], 0),
             ratio(r["ttft_speedup_vs_miss"], 1), r["same_tokens_in_round"]]
            for r in load_csv(root, "results/prefix_cache.summary.csv")]
    figures = Figures(["prefix", "case", "prompt tokens", "cached tokens", "p50 TTFT ms", "TTFT vs miss",
                       "same tokens"], rows, load_json(root, "results/prefix_cache.machine.json"))
    hit = next(r for r in rows if r[0] == "long" and r[1] == "hit")
    figures.headline.append(f"Prefix cache: a {hit[2]}-token prompt whose {hit[3]} tokens are cached starts "
                            f"answering {hit[5]} sooner than a miss ({hit[4]} ms to first token)")
    return figures


def read_paged_generation(root: Path) -> Figures:
    speed = [[r["method"], num(r["decode_tok_s_p50"], 1), num(r["ttft_p50_s"], 3), ratio(r["x_custom_cache"])]
             for r in load_csv(root, "results/paged_generation.csv")]
    memory = [[r["sequences"], r["prefix_sharing"], r["logical_tokens"], r["blocks_held"], num(r["kv_mib"], 1)]
              for r in load_csv(root, "results/paged_generation_memory.csv")]
    sharing = [[r["sequences"], r["prefix_sharing"], num(r["wall_s"], 2), r["cached_tokens_total"],
                num(r["ttft_p50_rest_s"], 3), r["peak_blocks"]]
               for r in load_csv(root, "results/paged_generation_sharing_run.csv")]
    figures = Figures(["method", "p50 decode tok/s", "p50 TTFT s", "vs custom_cache"], speed,
                      optional_json(root, "results/paged_generation.machine.json"))
    figures.tables.append(("KV memory of sequences sharing a system prompt",
                           ["sequences", "prefix sharing", "logical tokens", "blocks held", "KV MiB"], memory))
    figures.tables.append(("The same through the model (the first request alone, then the rest at once)",
                           ["sequences", "prefix sharing", "wall s", "cached tokens", "p50 TTFT of the rest s",
                            "peak blocks"], sharing))
    last = [r for r in memory if r[0] == memory[-1][0]]
    off, on = (next(r[4] for r in last if r[1] == flag) for flag in ("False", "True"))
    figures.headline.append(f"Paged KV cache: {last[0][0]} sequences sharing a system prompt hold {on} MiB "
                            f"of KV blocks with prefix sharing instead of {off} MiB")
    return figures


def read_speculative(root: Path) -> Figures:
    data = load_json(root, "results/speculative.json")
    rows = [[quant, ratio(s["copy_batch1_x_median"]), ratio(s["none_batch1_x_median"]),
             ratio(s["none_batch1_x_min"]), ratio(s["batch8_x"]), s["greedy_identical"]]
            for quant, s in data["summary"].items()]
    figures = Figures(["MINISERVE_QUANT", "copy-heavy, batch 1 (median)", "nothing to copy (median)",
                       "nothing to copy (worst)", "serving loop, 24 jobs", "greedy identical"], rows,
                      data["machine"], data["machine"].get("command"))
    figures.notes.append("Speed with speculative decoding on divided by off, the same prompts in one run.")
    default = data["machine"].get("default_quant_resolves_to", rows[0][0])
    pick = next(r for r in rows if r[0] == default)
    figures.headline.append(f"Speculative decoding (n-gram drafter, `{default}`): {pick[1]} on copy-heavy "
                            f"prompts at batch 1, {pick[2]} where there is nothing to copy")
    return figures


QUANT_SETTINGS = ("none", "q8", "llama.cpp")  # what MINISERVE_QUANT offers, and the reference


def read_quantization(root: Path) -> Figures:
    data = load_json(root, "results/quantization.json")
    rows = [[r["setting"], num(r["decode_tps_b1"], 1), ratio(r["speedup_b1"]), ratio(r["vs_llama_b1"]),
             num(r.get("decode_tps_batched"), 1), num(r["agree_free"], 3), num(r.get("agree_tf"), 3),
             num(r.get("worker_mb"), 0)]
            for r in data["rows"] if r["setting"] in QUANT_SETTINGS]
    figures = Figures(["setting", "decode tok/s, batch 1", "vs none", "vs llama.cpp",
                       f"tok/s, batch {data['args'].get('batch', '')}", "agreement, free-running",
                       "agreement, teacher-forced", "worker MB"], rows, data["machine"],
                      "python -m bench.quantization")
    figures.notes.append("Agreement: the share of greedy tokens equal to the bf16 reference's.")
    q8 = next(r for r in rows if r[0] == "q8")
    figures.headline.append(f"`q8` weights (the CPU default): {q8[1]} tok/s at batch 1, {q8[2]} bf16 and "
                            f"{q8[3]} llama.cpp on the same machine, free-running agreement {q8[5]}")
    return figures


def read_constrained(root: Path) -> Figures:
    data = load_json(root, "results/constrained_overhead.json")
    rows = [[s["mode"], s["variant"], num(s.get("ms_per_token_median") or s.get("ms_per_step_median"), 1),
             num(100 * s["grammar_share_median"], 1), s["all_valid"]] for s in data["summary"]]
    return Figures(["mode", "variant", "median ms per token (batch 1) or step (batch 8)", "grammar share %",
                    "all valid"], rows, data["machine"], data.get("command"))


TOOL_CHOICE = "results/tool_choice.json"


def read_agent(root: Path) -> Figures:
    data = load_json(root, "results/agent_eval.json")
    keys = ("raw_routing", "routing", "tool_result", "end_to_end")
    rows = [[name, c["cases"], *(num(c[k], 3) for k in keys)]
            for name, c in [*data["categories"].items(), ("overall", data["overall"])]]
    run = data["run"]
    figures = Figures(["category", "cases", "routing (model alone)", "routing (with safeguards)",
                       "tool result", "end to end"], rows, run.get("machine", {}))
    figures.notes.append(f"{run['model']}, {run['dtype']}, method `{run['method']}`, at most {run['max_steps']} "
                         f"steps; p50 latency {num(data['overall']['latency_ms_p50'], 0)} ms per case.")
    overall = rows[-1]
    share = {k: num(100 * data["overall"][k], 0) for k in keys}
    figures.headline.append(f"Agent: {share['end_to_end']}% of {overall[1]} cases right end to end; the safeguards "
                            f"lift tool routing from {share['raw_routing']}% to {share['routing']}%")
    if (root / TOOL_CHOICE).exists():
        figures.tables.append(tool_choice_table(load_json(root, TOOL_CHOICE)))
    return figures


def tool_choice_table(data: dict[str, Any]) -> tuple[str, list[str], list[Row]]:
    """``--tool-choice``: calls under ``tool_choice: auto`` on the own cases, per call-start rule."""
    label = {"brace": "brace (old: any `{` opens a call)", "name": "name (a tag, or `{\"name\": tool}`)"}
    rows = [[label.get(rule, rule), s["cases"], f"{s['unwanted_calls']} / {s['no_call_wanted']}",
             f"{s['missed_calls']} / {s['call_wanted']}", s["wrong_tool"], s["wrong_arguments"]]
            for rule, s in data["summary"].items()]
    return (f"`tool_choice: auto` on data/tool_choice_cases.json (`{data['command']}`, {data['model']})",
            ["call-start rule", "cases", "calls made when none was wanted", "calls missed", "wrong tool",
             "wrong arguments"], rows)


def read_queue_overhead(root: Path) -> Figures:
    data = load_json(root, "results/queue_overhead.json")
    rows = [[s["path"], num(s["ttft_p50_ms"], 1), num(s["ttft_p90_ms"], 1), num(s["total_p50_ms"], 1)]
            for s in data["summary"]]
    added, burst = data["added"], data["burst"]
    rows.append(["queue minus direct", num(added["ttft_p50_added_ms"], 1), "-", num(added["total_p50_added_ms"], 1)])
    figures = Figures(["path", "p50 TTFT ms", "p90 TTFT ms", "p50 total ms"], rows, data["machine"])
    figures.notes.append(f"Burst: {burst['jobs']} jobs from {burst['clients']} clients, {num(burst['jobs_per_s'], 1)} "
                         f"jobs/s, {burst['lost']} lost, {burst['duplicated']} duplicated.")
    if (root / SERVED).exists():
        served_table(figures, load_json(root, SERVED))
    if (root / BATCH_API).exists():
        figures.tables.append(batch_api_table(load_json(root, BATCH_API)))
    return figures


BATCH_API = "results/batch_api.json"


def batch_api_table(data: dict[str, Any]) -> tuple[str, list[str], list[Row]]:
    """``--batch-api``: one Batch API batch against the same chats sent as separate /v1 calls."""
    separate, batch = data["separate"], data["batch"]
    rows = [["separate /v1 calls", separate["requests"], f"{separate['clients']} clients", num(separate["seconds"], 1),
             num(separate["requests_per_s"], 2), separate["succeeded"]],
            ["one batch", batch["requests"], "-", num(batch["seconds"], 1), num(batch["requests_per_s"], 2),
             batch["succeeded"]]]
    return (f"The Batch API (`python -m bench.queue_overhead --batch-api`, {data['max_tokens']} tokens per chat): "
            f"{ratio(data['batch_over_separate'])} the requests/s of separate calls",
            ["way", "requests", "clients", "seconds", "requests/s", "succeeded"], rows)


SERVED = "results/queue_served.json"
SERVED_COMMAND = "python -m bench.queue_overhead --served"


def served_command(args: dict[str, Any]) -> str:
    """The command that made the file: the clients it ran, and llama-server where it took part."""
    clients = " ".join(str(n) for n in args.get("clients", []))
    llama = " --llama-server PATH" if args.get("llama_server") else ""
    return f"{SERVED_COMMAND} --clients {clients}{llama}" if clients else SERVED_COMMAND


def llama_lead(summary: list[dict[str, Any]]) -> list[tuple[int, float]]:
    """(clients, our /v1 tokens/s over llama-server's) where a run measured both."""
    by = {(s["clients"], s["mode"]): s["tok_per_s"] for s in summary}
    return [(n, by[(n, "v1")] / by[(n, "llama")]) for n, mode in by if mode == "llama" and (n, "v1") in by]


def served_table(figures: Figures, data: dict[str, Any]) -> None:
    """``--served``: streaming /v1 clients against the in-process engine (and llama-server)."""
    rows = []
    for s in data["summary"]:
        cpu = s.get("cpu_s_per_1k_tokens") or {}
        rows.append([s["clients"], s["mode"], num(s["tok_per_s"], 1), ratio(s["x_inproc"]), num(s["ttft_p50_s"], 3),
                     ", ".join(f"{k} {num(v, 2)}" for k, v in cpu.items())])
    args = data["args"]
    figures.tables.append((f"Streaming chats through `/v1` against the in-process batched engine, same requests "
                           f"(`{served_command(args)}`, model `{Path(args['model']).name}`: {args['rounds']} chats of "
                           f"{args['new_tokens']} greedy tokens per client, median of {args['repeats']} interleaved runs; "
                           f"{machine_kind(data.get('machine') or {})})",
                           ["clients", "path", "tok/s", "x in-process", "TTFT p50 s", "CPU s per 1k tokens"], rows))
    figures.notes.append("`inproc`: client threads submitting to an engine loop in the benchmark's process, as a "
                         "worker's job threads do; `v1`: the same chats as streaming HTTP clients of the whole stack. "
                         "CPU time is read from /proc for the web, the worker and redis-server (`engine`: the "
                         "benchmark process). `--llama-server PATH` (or `MINISERVE_LLAMA_SERVER`) adds `llama`: "
                         "llama.cpp's server (`--cont-batching` with one slot per client, started afresh and "
                         "warmed for each client count: its best at each) on the same GGUF, same chats.")
    lead = llama_lead(data["summary"])
    if lead:
        figures.add_headline("Through `/v1`, against llama.cpp's own `llama-server` on the same GGUF and chats: "
                             + " / ".join(ratio(x) for _, x in lead) + " its tokens/s at "
                             + " / ".join(str(n) for n, _ in lead) + " streaming clients",
                             data.get("machine"))
    at8 = next((s for s in data["summary"] if s["clients"] == 8 and s["mode"] == "v1"), None)
    if at8 and at8.get("x_inproc"):
        figures.add_headline(f"Through `/v1` with 8 streaming clients: {ratio(at8['x_inproc'])} the in-process "
                             f"engine's tokens/s on the same requests (model `{Path(args['model']).name}`)",
                             data.get("machine"))


KILL_FLAGS = "--workers 2 --max-new-tokens 64 --kill-worker-after 2 --output results/load_kill.csv"
LOAD_FILES = (("results/load.json", "one worker"), ("results/load_kill.json", "a worker killed mid-run"))


def read_load(root: Path) -> Figures:
    rows, machine = [], {}
    for name, label in LOAD_FILES:
        if not (root / name).exists():
            continue
        data = load_json(root, name)
        setup, s = data["setup"], data["summary"]
        machine = machine or data["machine"]
        rows.append([label, setup["workers"], f"{setup['pool']} x{setup['concurrency']}", setup["method"],
                     s["jobs"], num(s["jobs_per_s"], 1), num(s["total_p50_ms"], 0), num(s["total_p99_ms"], 0),
                     s["lost"], s["duplicated"], s["failed"], s["re_run"]])
    figures = Figures(["run", "workers", "pool", "method", "jobs", "jobs/s", "p50 total ms", "p99 total ms",
                       "lost", "duplicated", "failed", "re-run"], rows, machine)
    figures.notes.append("50 clients, the tiny test model: this measures the service, not the model. The killed run: "
                         f"`python -m bench.load {KILL_FLAGS}`.")
    if (root / CONNECTIONS).exists():
        read_connections(load_json(root, CONNECTIONS), figures)
    return figures


CONNECTIONS = "results/connections.json"


def read_connections(data: dict[str, Any], figures: Figures) -> None:
    """The connections mode: ``/health`` and a new job's TTFT, alone and beside thousands of
    held streams and slowloris sockets (a table and a note added to the Load section)."""
    setup, subs, slow, machine = data["setup"], data["subscribers"], data["slowloris"], data["load_phase_machine"]
    rows = [[phase, num(data["health"][phase]["p50_ms"], 1), num(data["health"][phase]["p99_ms"], 1),
             data["health"][phase]["n"], num(data["ttft"][phase]["p50_ms"], 1), data["ttft"][phase]["n"]]
            for phase in ("unloaded", "loaded")]
    load = (f"{setup['connections']} held SSE streams, {setup['cycling_subscribers']} cycling over finished jobs and "
            f"{setup['slowloris']} slowloris sockets")
    figures.tables.append((f"`python -m bench.load --connections {setup['connections']} --slowloris {setup['slowloris']}` "
                           f"(a fake worker, {setup['web_workers']} web processes, {machine_kind(data['machine'])}; loaded: {load})",
                           ["phase", "/health p50 ms", "/health p99 ms", "probes", "TTFT p50 ms", "jobs"], rows))
    drops = slow["header_drip"]["dropped_by_server"] + slow["body_drip"]["dropped_by_server"]
    figures.notes.append(f"Connections: {subs['held']} held streams, {subs['held_lost']} lost an event, "
                         f"{subs['cycling_streams']} cycling streams, {subs['cycling_incomplete']} incomplete; "
                         f"slowloris sockets dropped by the server {drops} times; loaded TTFT "
                         f"{ratio(data['ttft_loaded_over_unloaded'], 1)} unloaded; while loaded the web ran "
                         f"{num(machine['web_cpu_s_per_s'])} CPU-s/s and waited {num(machine.get('web_runqueue_wait_s_per_s'))} "
                         f"s/s runnable for a CPU (load average {num(machine['load_average_1m'], 1)}).")
    figures.add_headline(f"Connections: {load}; `/health` p99 {num(data['health']['loaded']['p99_ms'], 0)} ms, "
                         f"a new job's first token in {ratio(data['ttft_loaded_over_unloaded'], 1)} its unloaded time, "
                         f"{subs['held_lost']} streams lost an event", data["machine"])


def read_scale(root: Path) -> Figures:
    data = load_json(root, "results/scale.json")
    rows = [["pinned" if r["pinned"] else "shared", r["workers"], num(r["jobs_per_s_median"], 1), ratio(r["x_one"])]
            for r in data["a"]["runs"]]
    figures = Figures(["CPU", "worker processes", "jobs/s (median)", "vs one worker"], rows, data["machine"],
                      data.get("command"))
    kill = data.get("c")
    if kill:
        figures.notes.append(f"A worker killed: its jobs finished elsewhere within {num(kill['max_finished_after_kill_s'], 1)} s "
                             f"(lease {kill['lease_s']} s); all succeeded: {num(kill['all_succeeded'])}.")
    if (root / SCALE_ROUTING).exists():
        figures.tables.append(scale_routing(load_json(root, SCALE_ROUTING)))
    if (root / SCALE_REDIS).exists():
        figures.tables.append(scale_redis(load_json(root, SCALE_REDIS)))
    return figures


SCALE_ROUTING, SCALE_REDIS = "results/scale_routing.json", "results/scale_redis_cost.json"


def scale_routing(data: dict[str, Any]) -> tuple[str, list[str], list[Row]]:
    """Part (b): cache-aware routing off and on, two real-model workers."""
    part = data["b"]
    rows = [[mode, part[mode]["jobs"], num(100 * part[mode]["hit_share_repeats"], 0), num(part[mode]["ttft_p50_s"], 2),
             num(part[mode]["ttft_p90_s"], 2), num(part[mode]["tokens_per_s"], 1)] for mode in ("off", "on")]
    title = (f"Cache-aware routing, two real-model workers (`{clean_command(data['command'])}`; "
             f"TTFT p50 {ratio(part['ttft_p50_ratio_off_over_on'], 1)} better with routing on)")
    return title, ["routing", "jobs", "repeats hitting the cache %", "TTFT p50 s", "TTFT p90 s", "tokens/s"], rows


def scale_redis(data: dict[str, Any]) -> tuple[str, list[str], list[Row]]:
    """Part (d), one event per token: what a job and an event cost Redis."""
    d = data["d"]
    rows = [["per streamed event", num(d["ops_per_event"], 1), num(d["server_us_per_event"], 0), num(d["stream_bytes_per_event"], 0)],
            ["per job (fixed part)", num(d["ops_per_job_fixed"], 1), num(d["server_us_per_job_fixed"], 0), num(d["job_hash_bytes"], 0)],
            ["per second, one idle worker", num(d["idle_ops_per_s_one_worker"], 1), "-", "-"]]
    return (f"Redis cost (`{clean_command(data['command'])}`)", ["", "commands", "Redis CPU us", "bytes"], rows)


def read_soak(root: Path) -> Figures:
    data = load_json(root, "results/soak.json")
    states = ", ".join(f"{k} {v}" for k, v in data["job_states"].items())
    faults = ", ".join(kind for _, kind in data["faults"])
    rows = [["minutes", num(data["minutes"], 0)], ["clients (hostile share)", f"{data['clients']} ({data['hostile_share']})"],
            ["faults injected", faults], ["jobs accepted", data["accepted_jobs"]], ["ended as", states],
            ["lost", data["lost"]], ["duplicated terminal events", data["duplicated_terminal_events"]],
            ["repeated SSE sequence numbers", data["repeated_sse_seqs"]], ["re-run after the kill", data["re_run"]],
            ["HTTP 500", data["http_500"]], ["HTTP 503 (during the Redis outage)", data["http_503"]],
            ["5xx outside the outage", data["http_5xx_outside_outage"]]]
    machine = {**data["machine"], "cpu_model": data.get("cpu")}
    figures = Figures(["", "value"], rows, machine, data.get("command"))
    figures.headline.append(f"Soak: {data['accepted_jobs']} jobs in {num(data['minutes'], 0)} minutes with a worker "
                            f"killed and Redis down for {data['outage_s']} s: {data['lost']} lost, "
                            f"{data['http_5xx_outside_outage']} server errors outside the outage")
    if (root / SOAK_MEMORY).exists():
        memory = load_json(root, SOAK_MEMORY)
        figures.tables.append(soak_memory(memory))
        figures.notes += official_reload_note(memory.get("official_reload", []))
        after = memory["readings"][1]
        figures.add_headline(f"Worker memory (default model, `{memory['quant']}`): {num(after['VmRSS_mb'], 0)} MB "
                             f"resident after {memory['jobs']} mixed jobs, {num(after['RssFile_mb'], 0)} MB of "
                             f"it mapped files", memory.get("machine"))
    return figures


SOAK_MEMORY = "results/soak_memory.json"  # python -m bench.soak --memory; shown when committed


def official_reload_note(events: list[dict[str, Any]]) -> list[str]:
    """What the official job paid to reload the full-precision weights and what it freed after."""
    restored = [e for e in events if e.get("event") == "full_weights_restored"]
    freed = [e for e in events if e.get("event") == "full_weights_freed"]
    if not restored:
        return []
    return [f"The `official` job reloaded {num(restored[-1]['mb'], 0)} MB of full-precision weights in "
            f"{num(restored[-1]['latency_ms'], 0)} ms (`full_weights_restored`) and "
            + (f"freed {num(freed[-1]['mb'], 0)} MB when it ended (`full_weights_freed`)." if freed
               else "kept them (`MINISERVE_OFFICIAL_KEEP_WEIGHTS`).")]


def soak_memory(data: dict[str, Any]) -> tuple[str, list[str], list[Row]]:
    """The memory mode: one default worker's resident memory at three points."""
    rows = [[r["stage"], num(r["VmRSS_mb"], 0), num(r["RssAnon_mb"], 0), num(r["RssFile_mb"], 0), num(r["Pss_mb"], 0),
             num(r.get("peak_sampled_mb"), 0), num(r["VmHWM_mb"], 0),
             ", ".join(f"{name} {num(mb, 0)}" for name, mb in list(r["file_mappings_mb"].items())[:3])]
            for r in data["readings"]]
    machine = data.get("cpu") or "machine not recorded"
    title = (f"Worker memory, MB (`{clean_command(data['command'])}`: {data['model']}, `{data['quant']}`, "
             f"{data['pool']} pool x {data['concurrency']}, {data['clients']} clients, max_new_tokens "
             f"{data['max_tokens']}; {machine}). Anon is private heap (the weights, caches, allocator); file "
             f"is mapped files (libraries, the embedding table): clean pages shared with other processes "
             f"mapping them, which the kernel can drop and re-read; Pss counts a shared page once per sharer")
    return title, ["after", "VmRSS", "anon", "file", "Pss", "peak while running", "VmHWM", "largest file mappings"], rows


def read_fairness(root: Path) -> Figures:
    """Recorded by the engine-loop benchmark: a paged job's token gaps while other methods run."""
    data = load_json(root, "results/fairness.json")
    summary = data.get("summary", {})
    rows = [[key, num(value, 2) if isinstance(value, float) else json.dumps(value) if isinstance(value, (dict, list)) else value]
            for key, value in summary.items()]
    return Figures(["", "value"], rows, data.get("machine", {}), data.get("command"))


def read_models(root: Path) -> Figures:
    """Both bundled models under ``none`` and ``q8``, and llama.cpp's native tools on their GGUF files."""
    data = load_json(root, "results/models.json")
    batch = data["args"].get("batch", 8)
    llama = {r["model"]: r for r in data["rows"] if r["setting"] == "llama.cpp"}

    def vs_llama(row: dict[str, Any]) -> str:
        base = llama.get(row["model"])
        return ratio(row["decode_tps_b1"] / base["decode_tps_b1"]) if base and row is not base else "-"

    rows = [[r["model"], r["setting"] + (f" ({r['quant']})" if r.get("quant") else ""), num(r["decode_tps_b1"], 1),
             num(r.get(f"decode_tps_b{batch}"), 1), ratio(r.get("b1_vs_default")), vs_llama(r)]
            for r in data["rows"]]
    figures = Figures(["model", "setting", "decode tok/s, batch 1", f"decode tok/s, batch {batch}",
                       "batch 1 vs the default model", "batch 1 vs llama.cpp"], rows, data["machine"],
                      "python -m bench.models")
    figures.notes.append(f"llama.cpp: {data.get('llama_cpp', 'not run')}. Its tools build natively from the "
                         "`llama-cpp-python` sdist: `pip download llama-cpp-python==0.3.36 --no-binary :all: --no-deps`, "
                         "unpack, then `cmake -S vendor/llama.cpp -B build -DLLAMA_CURL=OFF && cmake --build build "
                         "--target llama-bench llama-batched-bench llama-server`; pass `--llama-bin build/bin`. "
                         "On a virtual machine whose CPU hides some of what its compiler detects (an illegal "
                         "instruction at start), name the features instead: `-DGGML_NATIVE=OFF -DGGML_AVX2=ON "
                         "-DGGML_FMA=ON -DGGML_F16C=ON`, and `-DGGML_AVX512=ON -DGGML_AVX512_VNNI=ON` where it has them.")
    figures.notes.append("The batch-1 ratio between the models depends on the CPU, for llama.cpp as for us: the "
                         "small model's 30 layers of small matrices carry a fixed cost per layer (the thread team "
                         "meets at barriers between the pieces of each) that weighs more on some machines; "
                         "llama.cpp's own ratio on the same files, in its rows, shows the machine's.")
    for name, met in data.get("checks", {}).items():
        figures.notes.append(f"Target {name}: {'met' if met else 'not met'}.")
    by = {(r["model"], r["setting"]): r for r in data["rows"]}
    small = by.get(("smollm2-135m-instruct", "q8"))
    if small:
        figures.headline.append(f"Second bundled model: SmolLM2-135M under `q8` decodes {num(small['decode_tps_b1'], 1)} "
                                f"tok/s at batch 1, {ratio(small['b1_vs_default'])} the default model and "
                                f"{vs_llama(small)} llama.cpp on the same file")
    return figures


SECTIONS: tuple[Section, ...] = (
    Section("compare_generation", "Generation methods side by side",
            "How fast is each generation method, and does it produce the same tokens as transformers' `generate`?",
            "python -m bench.compare_generation",
            ("results/compare_generation_bfloat16.summary.csv", "results/compare_generation_bfloat16.machine.json",
             "results/compare_generation_float32.summary.csv", "results/compare_generation_float32.machine.json"),
            read_compare_generation, ("results/compare_generation_bfloat16.png", "results/compare_generation_float32.png")),
    Section("batching", "Continuous batching",
            "How much throughput do concurrent jobs gain from one batched engine, against one at a time and transformers?",
            "python -m bench.batching", ("results/batching.csv",), read_batching, ("results/batching.png",)),
    Section("prefix_cache", "Prefix cache",
            "How much sooner does a prompt start answering when its prefix is cached?",
            "python -m bench.prefix_cache", ("results/prefix_cache.summary.csv", "results/prefix_cache.machine.json"), read_prefix_cache,
            ("results/prefix_cache.png",)),
    Section("paged_generation", "Paged KV cache",
            "What does the paged cache cost in decode speed, and how much KV memory does prefix sharing save?",
            "python -m bench.paged_generation",
            ("results/paged_generation.csv", "results/paged_generation_memory.csv", "results/paged_generation_sharing_run.csv",
             "results/paged_generation.machine.json"), read_paged_generation,
            ("results/paged_generation.png",)),
    Section("models", "Bundled models",
            "How fast does each bundled model decode at batch 1 and 8, full precision and `q8`, beside llama.cpp on the same GGUF file?",
            "python -m bench.models", ("results/models.json",), read_models),
    Section("quantization", "Weight quantization",
            "How fast are `q8` weights against bf16 and llama.cpp, how much memory do they take, and how often do they pick the same tokens?",
            "python -m bench.quantization", ("results/quantization.json",), read_quantization,
            ("results/quantization.png",)),
    Section("speculative", "Speculative decoding",
            "What does the n-gram drafter gain where the answer copies the prompt, and what does it cost where it does not?",
            "python -m bench.speculative", ("results/speculative.json",), read_speculative, ("results/speculative.png",)),
    Section("constrained_overhead", "Constrained decoding",
            "What does a JSON-schema grammar cost per token, alone and in a batch?",
            "python -m bench.constrained_overhead", ("results/constrained_overhead.json",), read_constrained,
            ("results/constrained_overhead.png",)),
    Section("evaluate_agent", "Agent evaluation",
            "How often does the agent pick the right tool and reach the right answer on the evaluation cases?",
            "python -m bench.evaluate_agent", ("results/agent_eval.json", TOOL_CHOICE), read_agent, ("results/agent_eval.png",)),
    Section("queue_overhead", "Queue overhead",
            "How much latency do web, Redis and Celery add to a direct engine call?",
            "python -m bench.queue_overhead", ("results/queue_overhead.json", SERVED, BATCH_API), read_queue_overhead,
            ("results/queue_overhead.png", "results/queue_served.png")),
    Section("load", "Load",
            "Does the service lose, duplicate or fail jobs under 50 clients, and when a worker is killed? Does `/health` stay fast beside thousands of open streams?",
            "python -m bench.load", ("results/load.json", "results/load_kill.json", CONNECTIONS), read_load,
            ("results/load.png", "results/load_kill.png", "results/connections.png")),
    Section("scale", "Scaling out",
            "How does throughput grow with worker processes, and how fast do a dead worker's jobs move?",
            "python -m bench.scale", ("results/scale.json", "results/scale_routing.json", "results/scale_redis_cost.json"),
            read_scale, ("results/scale.png", "results/scale_routing.png")),
    Section("soak", "Soak",
            "Over minutes of mixed and hostile traffic with a worker killed and Redis down, is any job lost or any answer a 500, and how much memory does a worker hold?",
            "python -m bench.soak --minutes 10", ("results/soak.json",), read_soak, ("results/soak.png",)),
    Section("fairness", "Loop fairness",
            "While jobs of every other method run, how long does a `paged` job wait between two tokens?",
            "python -m bench.fairness", ("results/fairness.json",), read_fairness, ("results/fairness.png",)),
)


# ---------------------------------------------------------------- the page and the block

def collect(root: Path) -> list[tuple[Section, Figures | None]]:
    return [(s, s.read(root) if (root / s.files[0]).exists() else None) for s in SECTIONS]


def section_lines(section: Section, figures: Figures | None, root: Path) -> list[str]:
    lines = [f"## {section.title}", "", f"*{section.question}*", ""]
    if figures is None:
        return lines + [f"Not run yet: `{section.command}` writes `{section.files[0]}`.", ""]
    lines += [f"- Command: `{clean_command(figures.command or section.command)}`",
              f"- Machine: {machine_line(figures.machine)}",
              f"- Files: {', '.join(f'`{name}`' for name in section.files)}", ""]
    lines += table(figures.header, figures.rows) + [""]
    for title, header, rows in figures.tables:
        lines += [f"{title}:", ""] + table(header, rows) + [""]
    lines += [*(f"{note}" for note in figures.notes), *([""] if figures.notes else [])]
    for png in section.pngs:
        if (root / png).exists():
            lines += [f"![{section.name}](../{png})", ""]
    return lines


def render_page(root: Path) -> str:
    sections = collect(root)
    lines = ["# Benchmarks", "",
             "Generated by `python -m bench.report` from the files under `results/`; do not edit by hand.",
             "Each section names the question, the command that wrote its files and the machine it ran on.",
             "Absolute speeds differ between machines; the ratios measured side by side in one run travel better.", ""]
    lines += [f"- [{s.title}](#{anchor(s.title)})" + ("" if f else " (not run yet)") for s, f in sections] + [""]
    for section, figures in sections:
        lines += section_lines(section, figures, root)
    return "\n".join(lines).rstrip() + "\n"


def anchor(title: str) -> str:
    return re.sub(r"[^a-z0-9 -]", "", title.lower()).replace(" ", "-")


def render_block(root: Path) -> str:
    """The README's headline figures: a few bullets, each linking to its section."""
    lines = [START]
    for section, figures in collect(root):
        for text in (figures.headline if figures else []):
            lines.append(f"- {text} ({machine_kind(figures.headline_machines.get(text, figures.machine))}; [details](docs/benchmarks.md#{anchor(section.title)})).")
    return "\n".join(lines + [END])


def rewrite_block(text: str, block: str) -> str:
    start, end = text.find(START), text.find(END)
    if start < 0 or end < start:
        raise ValueError(f"README.md lacks the {START} ... {END} block")
    return text[:start] + block + text[end + len(END):]


def outputs(root: Path = ROOT) -> dict[Path, str]:
    """The page and the README as the report would write them."""
    readme = (root / README).read_text()
    return {PAGE: render_page(root), README: rewrite_block(readme, render_block(root))}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only compare; exit 1 on a difference")
    args = parser.parse_args(argv)
    stale = []
    for path, text in outputs(ROOT).items():
        target = ROOT / path
        if target.exists() and target.read_text() == text:
            continue
        stale.append(str(path))
        if not args.check:
            target.write_text(text)
    verb = "differs" if args.check else "rewritten"
    print("\n".join(f"{name} {verb}" for name in stale) or "up to date")
    return 1 if args.check and stale else 0


if __name__ == "__main__":
    sys.exit(main())
