"""Embedding throughput: our engine in-process and through ``/v1/embeddings``, beside
sentence-transformers in-process on the same model, at batch 1 and batch 32; and whether
hybrid note retrieval (BM25 + embeddings, reciprocal rank fusion) helps.

Texts are the sentences of data/notes.json (English, 10-40 tokens). Each way embeds the same
texts: ``batch 1`` one text per call (per request), ``batch 32`` 32 texts per call; one
warm-up call, then ``--runs`` rounds calling every way in turn (a busy neighbour slows all
alike), texts/s at the p50 round; in-process ways also give texts per CPU-second. ``served, 32 clients``: 32
concurrent requests of one text each, which the embedding worker runs together (the forwards
it used are read from its heartbeat). All fp32 with ``--threads`` torch threads (the worker
gets the same). The vectors are compared too: ours against sentence-transformers', served
against in-process.

    python -m bench.embeddings [--runs 5] [--threads 1]   # writes results/embeddings.json
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable

import numpy as np
import requests
import torch

from bench.stats import machine_info, p50, print_table, write_json
from core.model_source import EMBEDDING_MODEL
from core.settings import load_settings
from core.workers import list_workers
from engine.embedding.model import EmbeddingModel
from engine.embedding.source import prepare_embedding_model
from tests.harness.stack import Stack, job_store, start_redis, wait_until
from tools.retriever import NoteRetriever, load_notes

BATCH = 32
# English rewordings of the evaluation's note questions that avoid the notes' own words:
# where BM25's coverage rule finds nothing, embeddings may still find the note.
PARAPHRASES = [
    ("How do servers avoid recomputing attention keys and values for earlier tokens?", "KV Cache"),
    ("Reusing the work done for a shared system prompt across requests", "Prefix Cache"),
    ("Storing attention state in fixed-size pages to cut memory fragmentation", "Paged KV Cache"),
    ("Encoding where a token sits by rotating query and key vectors", "RoPE (Rotary Position Embedding)"),
    ("Letting new requests join a running batch between decode steps", "Continuous Batching"),
    ("Several query heads sharing one key/value head", "Grouped-Query Attention (GQA)"),
    ("Making a small draft model propose tokens that the big model verifies", "Speculative Decoding"),
    ("Discouraging the model from saying the same words again", "Repetition Penalty"),
]


def texts() -> list[str]:
    out = []
    for note in load_notes():
        out += [s.strip().rstrip(".") + "." for s in note.body_en.split(". ") if len(s.split()) >= 4]
    return out[:BATCH]


def interleaved(ways: dict[str, Callable[[], None]], count: int, runs: int) -> dict[str, dict[str, float]]:
    """texts/s of each way (each call embeds ``count`` texts): one warm-up call each, then
    ``runs`` rounds that call every way once in turn, so a busy neighbour slows all ways
    alike; the p50 round per way. Also texts per CPU-second of this process (the in-process
    ways' own work, less sensitive to other load on a shared machine than wall time)."""
    for call in ways.values():
        call()
    wall: dict[str, list[float]] = {name: [] for name in ways}
    cpu: dict[str, list[float]] = {name: [] for name in ways}
    for _ in range(runs):
        for name, call in ways.items():
            started, cpu_started = time.perf_counter(), time.process_time()
            call()
            wall[name].append(time.perf_counter() - started)
            cpu[name].append(time.process_time() - cpu_started)
    return {name: {"texts_per_s": count / p50(wall[name]), "p50_s": p50(wall[name]), "runs": runs,
                   "spread": (max(wall[name]) - min(wall[name])) / p50(wall[name]),
                   "texts_per_cpu_s": count / p50(cpu[name])} for name in ways}


def in_process(model: EmbeddingModel, reference: Any, sample: list[str], runs: int) -> list[dict[str, Any]]:
    def ours(batch: int) -> Callable[[], None]:
        return lambda: [model.embed(model.encode(sample[i:i + batch], truncate=True))
                        for i in range(0, len(sample), batch)]

    def theirs(batch: int) -> Callable[[], None]:
        return lambda: [reference.encode(sample[i:i + batch], batch_size=batch, convert_to_numpy=True)
                        for i in range(0, len(sample), batch)]

    ways = {("ours, in-process", 1): ours(1), ("sentence-transformers, in-process", 1): theirs(1),
            ("ours, in-process", BATCH): ours(BATCH), ("sentence-transformers, in-process", BATCH): theirs(BATCH)}
    measured = interleaved({f"{way}|{batch}": call for (way, batch), call in ways.items()}, len(sample), runs)
    return [{"way": way, "batch": batch, **measured[f"{way}|{batch}"]} for way, batch in ways]


def served(sample: list[str], runs: int, threads: int, cache_dir: Path) -> tuple[list[dict[str, Any]], np.ndarray]:
    log_dir = Path(tempfile.mkdtemp(prefix="bench-embeddings-"))
    redis_proc, url = start_redis(log_dir)
    stack = Stack(redis_url=url, log_dir=log_dir, env_overrides={"MINISERVE_THREADS": str(threads),
                                                                  "MINISERVE_CACHE_DIR": str(cache_dir)})
    worker = stack.start_worker(name="emb", pool="threads", concurrency=BATCH, queues="bench",
                                MINISERVE_MODEL=EMBEDDING_MODEL)
    web, base = stack.start_web()
    store = job_store(url)
    session = requests.Session()

    def post(inputs: list[str], via: Any = session) -> list[list[float]]:
        """One request (``via``: the keep-alive session, or ``requests`` from the clients' threads)."""
        reply = via.post(f"{base}/v1/embeddings", json={"model": EMBEDDING_MODEL, "input": inputs}, timeout=300)
        reply.raise_for_status()
        return [d["embedding"] for d in reply.json()["data"]]

    def forwards() -> int:
        (info,) = [w["info"] for w in list_workers(store.client, 15) if w["info"].get("model_id") == EMBEDDING_MODEL]
        return int(info.get("cache_stats", {}).get("embedding_forwards", 0))

    try:
        wait_until(lambda: _up(base), 60, what="web")
        wait_until(lambda: any(w["info"].get("model_id") == EMBEDDING_MODEL
                               for w in list_workers(store.client, 15)), 120, what="embedding worker")
        vectors = np.array(post(sample))  # also loads the model
        pool = ThreadPoolExecutor(len(sample))
        time.sleep(6)  # a heartbeat (every 5 s) after that request carries its forward
        before = forwards()
        measured = interleaved({"b1": lambda: [post([t]) for t in sample], "b32": lambda: post(sample),
                                "clients": lambda: list(pool.map(lambda t: post([t], requests), sample))}, len(sample), runs)
        pool.shutdown()
        time.sleep(6)  # the heartbeat after the last run (every 5 s) carries the final count
        used = forwards() - before
        # forwards of all three ways: 32 + 1 per round (+ warm-up) for b1 and b32, the rest the clients'
        clients_forwards = used - (runs + 1) * (len(sample) + 1)
        rows = [{"way": "served /v1/embeddings", "batch": 1, **measured["b1"]},
                {"way": "served /v1/embeddings", "batch": BATCH, **measured["b32"]},
                {"way": f"served, {len(sample)} clients x 1 text", "batch": 1, **measured["clients"],
                 "inputs_per_forward": round(len(sample) * (runs + 1) / max(1, clients_forwards), 2)}]
        for row in rows:
            row.pop("texts_per_cpu_s")  # the work is in the worker's process, not this one
        return rows, vectors
    finally:
        web.stop()
        worker.stop()
        redis_proc.kill()


def _up(base: str) -> bool:
    try:
        return requests.get(f"{base}/healthz", timeout=1).status_code in (200, 503)
    except requests.RequestException:
        return False


def cosine_gap(a: np.ndarray, b: np.ndarray) -> float:
    return float((1 - (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)).max())


def retrieval(model: EmbeddingModel) -> dict[str, Any]:
    """Top-1 note right (or no note, where none should come) on the evaluation's retrieval
    cases and on the rewordings, BM25 alone against hybrid."""
    def embed(batch: list[str]) -> list[list[float]]:
        return model.embed(model.encode(batch, truncate=True)).tolist()

    cases = [c for c in json.loads(Path("data/agent_cases.json").read_text())
             if c["category"] in ("retrieval", "irrelevant_retrieval")]
    sets = {"evaluation cases": [(c["prompt"], c["tool_check"].get("note")) for c in cases],
            "rewordings": PARAPHRASES}
    notes = load_notes()
    retrievers = {"bm25": NoteRetriever(notes), "hybrid": NoteRetriever(notes, embed=embed)}
    out: dict[str, Any] = {}
    for set_name, queries in sets.items():
        for name, retriever in retrievers.items():
            right = 0
            for query, note in queries:
                hits = retriever.search(query)
                right += (not hits) if note is None else bool(hits) and hits[0].title == note
            out.setdefault(set_name, {"queries": len(queries)})[name] = right
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.embeddings", description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--no-served", action="store_true", help="skip the served rows (no stack)")
    parser.add_argument("--out", default="results")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    from sentence_transformers import SentenceTransformer

    cache_dir = Path(tempfile.mkdtemp(prefix="bench-embeddings-cache-"))
    folder = prepare_embedding_model(load_settings(cache_dir=cache_dir))
    model = EmbeddingModel(folder, threads=args.threads)
    reference = SentenceTransformer(str(folder), device="cpu")
    sample = texts()
    ours = model.embed(model.encode(sample, truncate=True)).numpy()
    theirs = reference.encode(sample, batch_size=BATCH, convert_to_numpy=True)
    rows = in_process(model, reference, sample, args.runs)
    agreement = {"ours_vs_sentence_transformers_max_cosine_gap": cosine_gap(ours, theirs)}
    if not args.no_served:
        served_rows, served_vectors = served(sample, args.runs, args.threads, cache_dir)
        rows += served_rows
        agreement["served_vs_in_process_max_cosine_gap"] = cosine_gap(served_vectors, ours)
    found = retrieval(model)
    tokens = [len(ids) for ids in model.encode(sample, truncate=True)]
    print_table(rows, ["way", "batch", "texts_per_s", "texts_per_cpu_s", "p50_s", "spread", "inputs_per_forward"])
    print(agreement)
    print(found)
    write_json(Path(args.out) / "embeddings.json", {
        "command": "python -m bench.embeddings" + (f" --runs {args.runs}" if args.runs != 5 else "")
                   + (f" --threads {args.threads}" if args.threads != 1 else ""),
        "machine": {**machine_info(), "load_average": list(os.getloadavg())}, "model": EMBEDDING_MODEL,
        "texts": len(sample), "tokens_per_text_median": statistics.median(tokens), "threads": args.threads,
        "rows": rows, "agreement": agreement, "retrieval": found})
    print(f"wrote {args.out}/embeddings.json")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
