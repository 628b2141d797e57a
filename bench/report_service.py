"""The report's readers for the service's benchmarks: the agent, the queue and ``/v1`` beside
llama-server, load and connections, scaling out, and the soak with its memory.
Each reads the files one benchmark writes under results/ into the :class:`Figures` of its section."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from bench.report_figures import Figures, Row, clean_command, load_json, machine_kind, num, ratio


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
    if (root / PRIORITIES).exists():
        figures.tables.append(priorities_table(load_json(root, PRIORITIES)))
    if (root / BATCH_CREATE).exists():
        figures.tables.append(batch_create_table(load_json(root, BATCH_CREATE)))
    if (root / FAIR_SHARE).exists():
        figures.tables.append(fair_share_table(load_json(root, FAIR_SHARE)))
    return figures


BATCH_API = "results/batch_api.json"
BATCH_CREATE = "results/batch_create.json"
FAIR_SHARE = "results/fair_share.json"


def fair_share_table(data: dict[str, Any]) -> tuple[str, list[str], list[Row]]:
    """``--fair-share``: key B's jobs beside key A's flood, and the estimated starts' error."""
    rows = [[_gate_label(r), num(r["b_alone_p50_s"], 2), num(r["b_beside_flood_p50_s"], 2), ratio(r["ratio"]),
             f"{r['a_jobs_succeeded']} of {r['flood_jobs']}", r["estimates"], num(r["estimate_error_p50"], 2),
             num(r["estimate_error_p90"], 2)] for r in data["rows"]]
    first = data["rows"][0]
    return (f"Fair share (`{data['command']}`: key A submits {first['flood_jobs']} jobs at once, then key B "
            f"{first['guest_jobs']}; {data['max_tokens']} tokens each, one worker with 8 slots; target: B within "
            f"{num(data['target_ratio'], 0)}x of alone). The estimate's error is |estimated - real start| over the "
            "real wait, for queued jobs that got one",
            ["queue", "B alone p50 s", "B beside A's flood p50 s", "ratio", "A's jobs succeeded",
             "estimates", "estimate error p50", "p90"], rows)


def batch_create_table(data: dict[str, Any]) -> tuple[str, list[str], list[Row]]:
    """``--batch-create``: what ``POST /v1/batches`` costs the web, answer and intake apart."""
    rows = [[c["case"], num(c["file_bytes"] / 1e6, 1), c["post_status"], num(c["post_seconds"], 3),
             num(c["intake_seconds"], 1), c["status"], c["request_counts"]["total"], c["request_counts"]["failed"],
             " / ".join(num(p["growth_mb"], 1) for p in c["processes"])] for c in data["cases"]]
    return (f"`POST /v1/batches` (`python -m bench queue_overhead --batch-create`, {data['model']} tokenizer, "
            f"{data['web_workers']} web processes, no worker): the answer, the intake reading every line after it, "
            "and each web process's peak RSS growth meanwhile",
            ["file", "MB", "answered", "POST s", "until validated s", "then", "lines", "refused",
             "RSS growth per web process MB"], rows)
PRIORITIES = "results/priorities.json"


def _gate_label(row: dict[str, Any]) -> str:
    if not row["queue_window"]:
        return "no gate (FIFO)"
    return f"fair gate, window {row['queue_window']}, {row.get('reserved_slots', 0)} reserved slot(s)"


def priorities_table(data: dict[str, Any]) -> tuple[str, list[str], list[Row]]:
    """``--priorities``: an interactive chat's TTFT alone and beside a running batch, gate on and off."""
    rows = [[_gate_label(r),
             num(r["ttft_alone_p50_s"], 3), num(r["ttft_beside_batch_p50_s"], 3), ratio(r["ratio"]),
             num(r.get("beside_queue_wait_p50_s"), 3), num(r.get("beside_engine_ttft_p50_s"), 3), r["probes"],
             r["batch_lines_done_before_cancel"]] for r in data["rows"]]
    return (f"An interactive chat beside a Batch API file of {data['batch_lines']} lines "
            f"(`python -m bench queue_overhead --priorities`, {data['max_tokens']} tokens per chat, one worker "
            "with 8 slots; beside the batch, the job's own wait to start and its engine TTFT once started)",
            ["queue", "p50 TTFT alone s", "p50 TTFT beside the batch s", "ratio", "waited to start s",
             "engine TTFT s", "chats", "batch lines done before the chats ended"], rows)


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
    if "batches_started" in data:
        rows.insert(6, ["Batch API batches started (not ended by the drain)",
                        f"{data['batches_started']} ({data['batches_not_ended']})"])
    if (root / WORKER_DEATH).exists():
        figures.tables.append(worker_death_table(load_json(root, WORKER_DEATH)))
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
WORKER_DEATH = "results/worker_death.json"  # python -m bench worker_death; shown when committed


def worker_death_table(data: dict[str, Any]) -> tuple[str, list[str], list[Row]]:
    """A worker SIGKILLed mid-stream: the client's gap, and whether its text is the answer."""
    yes = lambda flag: "yes" if flag else "no"  # noqa: E731
    rows = [[r["dtype"], r["seed"], r["attempts"], num(r["max_gap_s"], 1), num(r["kill_to_requeue_s"], 1),
             yes(r["text_equals_result"]), yes(r["usage_equals_result"]), r["resumed_at_token"],
             _first_difference(r)] for r in data["rows"]]
    return (f"A worker SIGKILLed mid-stream (`{clean_command(data['command'])}`: a seeded {data['tokens']}-token "
            f"`/v1` stream, killed after {data['kill_after']} chunks, two workers; target: largest gap at most "
            f"{num(data['target_max_gap_s'], 0)} s). The last column compares the answer with the same seeded request "
            "run again without a kill: in float32 they are equal; in bfloat16 two runs may part anywhere, the kill "
            "or not, where prefills of other shapes (a prefix-cache hit, the resumed prefill) round a draw apart",
            ["dtype", "seed", "attempts", "largest gap s", "kill to re-queue s", "client text = result",
             "usage = result", "resumed after token", "first token unlike an uninterrupted run's"], rows)


def _first_difference(row: dict[str, Any]) -> str:
    """Where the answer parts from the same seeded request run again without a kill (before
    the resume point: not the continuation's doing)."""
    if row["equals_uninterrupted"]:
        return "none (equal)"
    first = row["resumed_at_token"] + row["same_tokens_after_resume"]
    return f"{first} ({'before' if first < row['resumed_at_token'] else 'after'} the resume point)"


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


def read_embeddings(root: Path) -> Figures:
    """``bench.embeddings``: texts/s per way and batch, each beside sentence-transformers at
    the same batch; the vectors' agreement; hybrid retrieval against BM25."""
    data = load_json(root, "results/embeddings.json")
    reference = {r["batch"]: r["texts_per_s"] for r in data["rows"] if r["way"].startswith("sentence-transformers")}
    rows = [[r["way"], r["batch"], num(r["texts_per_s"], 1), ratio(r["texts_per_s"] / reference[r["batch"]]),
             num(r.get("texts_per_cpu_s"), 1), num(r.get("inputs_per_forward"), 1)] for r in data["rows"]]
    figures = Figures(["way", "batch", "texts/s (p50 round)", "vs sentence-transformers, same batch",
                       "texts per CPU-second", "inputs per forward"], rows, data["machine"], data.get("command"))
    agreement = data["agreement"]
    figures.notes.append(f"{data['model']}, fp32, {data['threads']} torch thread(s), {data['texts']} texts of "
                         f"{num(data['tokens_per_text_median'], 0)} tokens (median). Largest cosine gap: ours against "
                         f"sentence-transformers {agreement['ours_vs_sentence_transformers_max_cosine_gap']:.1e}"
                         + (f", served against in-process {agreement['served_vs_in_process_max_cosine_gap']:.1e}"
                            if "served_vs_in_process_max_cosine_gap" in agreement else "") + ". "
                         f"Load average when it ended: {num(data['machine'].get('load_average', [None])[0], 1)} "
                         "(texts per CPU-second: the in-process ways' own work, less sensitive to it).")
    retrieval = data["retrieval"]
    figures.tables.append(("Note retrieval, top note right (or none where none fits)",
                           ["queries", "count", "BM25", "hybrid (BM25 + embeddings, RRF)"],
                           [[name, r["queries"], r["bm25"], r["hybrid"]] for name, r in retrieval.items()]))
    by_way = {(r["way"], r["batch"]): r["texts_per_s"] for r in data["rows"]}
    ours32, st32 = by_way.get(("ours, in-process", 32)), reference.get(32)
    served32 = by_way.get(("served /v1/embeddings", 32))
    if ours32 and st32:
        figures.headline.append(f"Embeddings ({data['model']}): {num(ours32, 0)} texts/s at batch 32 in-process "
                                f"(sentence-transformers {num(st32, 0)})"
                                + (f", {num(served32, 0)} through `/v1/embeddings`" if served32 else ""))
    return figures
