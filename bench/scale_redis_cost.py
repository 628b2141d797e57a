"""``bench.scale`` part (d): what one job and one streamed event cost Redis.

Commands counted with ``INFO commandstats`` (those run inside Lua scripts included) and the
CPU time of Redis's main thread, for two batches of jobs that differ only in answer length,
so the per-job and per-event parts separate. The worker streams one event per token
(``MINISERVE_TOKEN_EVENT_INTERVAL_MS=0``): with the default coalescing the two batches would
differ by a handful of events and the split would be noise. The idle background of the worker (heartbeat,
reaper, Celery polling) is measured first and subtracted. These are the inputs of the
"100 workers" arithmetic in docs/deployment.md.
"""
from __future__ import annotations

import concurrent.futures as futures
import time
from pathlib import Path
from typing import Any

from core import keys
from tests.harness.client import submit_and_follow


def server_cpu_s(client) -> float:
    """CPU seconds of Redis's main thread (where commands run): what saturates first."""
    cpu = client.info("cpu")
    return float(cpu.get("used_cpu_user_main_thread", cpu["used_cpu_user"])) + \
        float(cpu.get("used_cpu_sys_main_thread", cpu["used_cpu_sys"]))


def command_calls(client) -> dict[str, int]:
    return {name.removeprefix("cmdstat_"): int(stats["calls"]) for name, stats in client.info("commandstats").items()}


def measure_batch(cluster, base: str, idle_rate: dict[str, float], max_new: int) -> dict[str, Any]:
    """24 jobs through the web (4 clients following SSE); Redis commands net of the idle rate."""
    client = cluster.store.client
    system = "You are a support agent for a bicycle shop; answer in one sentence. " * 4
    bodies = [{"system": system, "prompt": f"question {i}", "max_new_tokens": max_new, "generation_method": "paged"}
              for i in range(24)]
    client.config_resetstat()
    cpu_before, started = server_cpu_s(client), time.perf_counter()
    with futures.ThreadPoolExecutor(4) as pool:
        traces = list(pool.map(lambda body: submit_and_follow(base, body, timeout_s=300), bodies))
    busy_s, cpu = time.perf_counter() - started, server_cpu_s(client) - cpu_before
    net = {cmd: n - idle_rate.get(cmd, 0) * busy_s for cmd, n in command_calls(client).items()}
    records = [cluster.store.get(t.job_id) for t in traces]
    return {"max_new_tokens": max_new, "jobs": len(records), "seconds": round(busy_s, 2),
            "tokens": sum(r.result["usage"]["completion_tokens"] for r in records),
            "events": sum(len(cluster.store.events(t.job_id)) for t in traces), "ops": round(sum(net.values())),
            "server_cpu_s": round(cpu - idle_rate.get("_cpu_s", 0.0) * busy_s, 4),
            "by_command_per_job": {k: round(v / len(records), 2) for k, v in sorted(net.items()) if v > 0.5},
            "last_job": traces[-1].job_id}


def part_d(args, folder: Path, model: str, cluster_class) -> dict[str, Any]:
    env = {"MINISERVE_MODEL": model, "MINISERVE_DTYPE": "float32", "MINISERVE_DEVICE": "cpu",
           "MINISERVE_THREADS": "1", "MINISERVE_LOG_LEVEL": "WARNING", "MINISERVE_TOKEN_EVENT_INTERVAL_MS": "0"}
    cluster = cluster_class(folder / "d", env)
    try:
        cluster.start_workers(["da"], concurrency=4)
        base = cluster.start_web()
        client = cluster.store.client
        client.config_resetstat()
        idle_s, cpu_before = 20.0, server_cpu_s(client)
        time.sleep(idle_s)
        idle = command_calls(client)
        idle_rate = {cmd: n / idle_s for cmd, n in idle.items()}
        idle_rate["_cpu_s"] = (server_cpu_s(client) - cpu_before) / idle_s
        short, long_ = (measure_batch(cluster, base, idle_rate, n) for n in (8, 64))
        per_event = (long_["ops"] - short["ops"]) / (long_["events"] - short["events"])
        fixed = (short["ops"] - per_event * short["events"]) / short["jobs"]
        cpu_event = (long_["server_cpu_s"] - short["server_cpu_s"]) / (long_["events"] - short["events"])
        cpu_fixed = (short["server_cpu_s"] - cpu_event * short["events"]) / short["jobs"]
        job_id = long_["last_job"]
        stream_bytes = client.memory_usage(keys.events_key(job_id)) or 0
        summary = {"idle_ops_per_s_one_worker": round(sum(idle.values()) / idle_s, 2),
                   "idle_by_command": {k: round(v, 2) for k, v in sorted(idle_rate.items()) if k != "_cpu_s"},
                   "idle_server_cpu_share": round(idle_rate["_cpu_s"], 4),
                   "batches": [{k: v for k, v in b.items() if k != "last_job"} for b in (short, long_)],
                   "ops_per_event": round(per_event, 2), "ops_per_job_fixed": round(fixed, 1),
                   "server_us_per_event": round(cpu_event * 1e6, 1), "server_us_per_job_fixed": round(cpu_fixed * 1e6, 1),
                   "stream_bytes_per_event": round(stream_bytes / len(cluster.store.events(job_id)), 1),
                   "job_hash_bytes": client.memory_usage(keys.job_key(job_id)) or 0}
        print(f"(d) {summary}", flush=True)
        return summary
    finally:
        cluster.close()
