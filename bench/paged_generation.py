"""End-to-end ``paged`` vs ``custom_cache`` on the real model, and KV memory: blocks against
contiguous reservations, and with prefix sharing.

Part 1 (decode speed): the same prompts through ``custom_cache`` (contiguous KV cache) and
``paged`` (block pool + block tables read by our attention), interleaved with alternating
order after a warmup, greedy; p50/mean decode tokens/s and time to first token per method.

Part 2 (reservation): the original MiniServe workload, requests of 17, 33, 65 and 129 tokens,
against a contiguous cache that reserves 256 token slots per request: the slots and MiB each
side allocates (the paged side from the engine's block manager at the engine's block size).

Part 3 (sharing): N concurrent sequences that share a ~1,000-token system prompt, each with its
own question.  Blocks held are read from the engine's block manager fed with the real
tokenizer's ids (the same allocation code the engine runs), with and without prefix sharing;
``--real-sharing N`` also runs N such requests through the model (the first one alone, then
the rest at once, with sharing) and reports their ``cached_tokens``, TTFT and pool peak.

Part 4 (choices, ``--choices N``): ``n = N`` choices of one ~1,000-token prompt, as a job with
``n`` runs them (one group, :meth:`engine.loop.EngineLoop.submit_group`: the first choice
prefills, the others take its prompt blocks) against the same N requests submitted at once
as separate requests (each admitted before any prompt block is committed, so each prefills
the whole prompt): prompt tokens the scheduler computed, peak blocks, wall time, TTFT.
``--only-choices`` runs this part alone.

    flock /tmp/miniserve-heavy.lock python -m bench.paged_generation [--repeats 5]
"""
from __future__ import annotations

import argparse
import time
from dataclasses import replace
from pathlib import Path

from bench.stats import RESULTS, machine_info, machine_line, p50, print_table, pyplot, write_csv, write_json
from core.settings import load_settings
from engine.batching import Scheduler
from engine.engine import Engine
from engine.handwritten import forward_for
from engine.loop import EngineLoop
from engine.paged import BlockManager
from engine.types import GenerationRequest, SamplingParams

QUESTIONS = ["Explain how a hash map handles collisions.", "What is a KV cache?",
             "Describe the TCP three-way handshake.", "Why is the sky blue?",
             "Explain gradient descent to a beginner.", "What does a B-tree optimise?",
             "How does garbage collection work in Python?", "What is copy-on-write?",
             "Explain the CAP theorem.", "What is a Bloom filter?", "How do mutexes work?",
             "What is backpropagation?", "Explain beam search.", "What is dropout?",
             "Describe a Merkle tree.", "What is rotary position embedding?"]

SYSTEM_SENTENCE = ("You are MiniServe's assistant. Answer precisely, cite the relevant notes, keep "
                   "code in fenced blocks, prefer short paragraphs, and say when you are unsure. ")


def system_prompt(tokenizer, target: int = 1000) -> str:
    text = ""
    while len(tokenizer.encode(text)) < target:
        text += SYSTEM_SENTENCE
    return text


def req(question: str, method: str, new_tokens: int, prefix: str | None = None) -> GenerationRequest:
    return GenerationRequest(messages=[{"role": "user", "content": question}], method=method,
                             prefix=prefix, sampling=SamplingParams(max_new_tokens=new_tokens))


def decode_speed(engine: Engine, repeats: int, new_tokens: int) -> list[dict]:
    methods = ["custom_cache", "paged"]
    for m in methods:                                   # warmup
        engine.generate(req(QUESTIONS[-1], m, 8))
    samples = {m: {"tps": [], "ttft": [], "same": []} for m in methods}
    for rep in range(repeats):
        order = methods if rep % 2 == 0 else methods[::-1]
        outs = {}
        for m in order:
            r = engine.generate(req(QUESTIONS[rep % len(QUESTIONS)], m, new_tokens))
            outs[m] = r
            samples[m]["tps"].append(r.timings.decode_tokens_per_s)
            samples[m]["ttft"].append(r.timings.ttft_s)
        samples["paged"]["same"].append(outs["paged"].token_ids == outs["custom_cache"].token_ids)
    rows = []
    for m in methods:
        s = samples[m]
        rows.append({"method": m, "decode_tok_s_p50": round(p50(s["tps"]), 2),
                     "decode_tok_s_mean": round(sum(s["tps"]) / len(s["tps"]), 2),
                     "ttft_p50_s": round(p50(s["ttft"]), 3), "repeats": repeats})
    base = rows[0]["decode_tok_s_p50"]
    for row in rows:
        row["x_custom_cache"] = round(row["decode_tok_s_p50"] / base, 3)
    rows[1]["greedy_identical"] = all(samples["paged"]["same"])
    rows[0]["greedy_identical"] = ""
    return rows


def memory(engine: Engine, counts: list[int], block_size: int) -> tuple[list[dict], int]:
    tok = engine.loaded.tokenizer
    system = system_prompt(tok)
    prompts = [engine.prompt(req(QUESTIONS[i % len(QUESTIONS)], "paged", 1, system)).ids
               for i in range(max(counts))]
    system_tokens = engine.prompt(req("x", "paged", 1, system)).prefix_len
    bytes_per_token = kv_bytes_per_token(engine)
    rows = []
    for n in counts:
        for sharing in (False, True):
            blocks = BlockManager(100_000, block_size, prefix_sharing=sharing)
            for i in range(n):
                blocks.allocate(i, prompts[i])
                blocks.commit(i)                 # K/V written, as the forward would
            s = blocks.stats()
            rows.append({"sequences": n, "prefix_sharing": sharing,
                         "system_tokens": system_tokens, "logical_tokens": s.logical_tokens,
                         "blocks_held": s.blocks_used, "kv_mib": round(
                             s.blocks_used * block_size * bytes_per_token / 2**20, 2),
                         "prefix_hit_tokens": s.prefix_hit_tokens})
    return rows, system_tokens


def reservation(lengths: list[int], block_size: int, reserve: int,
                bytes_per_token: int) -> tuple[list[dict], dict]:
    """Token slots held per request: paged blocks (what the block manager allocates for each
    length) vs a contiguous cache reserving ``reserve`` slots per request; and the totals."""
    blocks = BlockManager(sum(-(-n // block_size) for n in lengths), block_size, prefix_sharing=False)
    rows = []
    for seq, n in enumerate(lengths):
        blocks.allocate(seq, list(range(n)))
        paged = len(blocks.block_table(seq)) * block_size
        rows.append({"request": seq, "tokens": n, "contiguous_slots": reserve, "paged_slots": paged,
                     "contiguous_empty_slots": reserve - n, "paged_empty_slots": paged - n})
    st = blocks.stats()
    contiguous, paged = reserve * len(lengths), st.blocks_used * block_size
    summary = {"block_size": block_size, "reserve": reserve, "tokens": st.logical_tokens,
               "contiguous_mib": round(contiguous * bytes_per_token / 2**20, 3),
               "paged_mib": round(paged * bytes_per_token / 2**20, 3),
               "allocation_saved_pct": round(100 * (1 - paged / contiguous), 2),
               "paged_fragmentation_pct": round(100 * st.fragmentation, 2),
               "contiguous_unused_pct": round(100 * (contiguous - st.logical_tokens) / contiguous, 2)}
    return rows, summary


def kv_bytes_per_token(engine: Engine) -> int:
    """K and V of one token over every layer, at the engine's dtype."""
    g = engine.loop.call(lambda: forward_for(engine)).config
    return 2 * g.num_layers * g.num_kv_heads * g.head_dim * engine.loaded.dtype.itemsize


def real_sharing(engine: Engine, n: int, new_tokens: int) -> list[dict]:
    system = system_prompt(engine.loaded.tokenizer)
    rows = []
    for sharing in (False, True):
        forward = engine.loop.call(lambda: forward_for(engine))
        service = Scheduler.for_model(forward, engine.settings, prefix_sharing=sharing)
        batch = EngineLoop(engine, service)
        start = time.perf_counter()
        first = batch.submit(req(QUESTIONS[0], "paged", new_tokens, system)).result()
        rest = [batch.submit(req(QUESTIONS[i], "paged", new_tokens, system)) for i in range(1, n)]
        results = [first] + [f.result() for f in rest]
        wall = time.perf_counter() - start
        batch.close()
        st = service.blocks.stats()
        rows.append({"sequences": n, "prefix_sharing": sharing, "wall_s": round(wall, 2),
                     "cached_tokens_total": sum(r.usage.cached_tokens for r in results),
                     "ttft_p50_rest_s": round(p50([r.timings.ttft_s for r in results[1:]]), 3),
                     "peak_blocks": st.peak_blocks_used})
    return rows


def choices(engine: Engine, n: int, new_tokens: int) -> list[dict]:
    """N choices of one prompt: one group, or N requests submitted together (see the module doc)."""
    system = system_prompt(engine.loaded.tokenizer)
    rows = []
    for mode in ("separate", "group"):
        forward = engine.loop.call(lambda: forward_for(engine))
        service = Scheduler.for_model(forward, engine.settings)
        batch = EngineLoop(engine, service)
        # no drafts: every token past the prompts is then one decode (the prompt count below is exact)
        requests = [replace(req(QUESTIONS[0], "paged", new_tokens, system), speculative=False) for _ in range(n)]
        start = time.perf_counter()
        handles = batch.submit_group(requests) if mode == "group" else [batch.submit(r) for r in requests]
        results = [h.result() for h in handles]
        wall = time.perf_counter() - start
        stats = batch.call(service.snapshot)
        batch.close()
        prompt = results[0].usage.prompt_tokens
        generated = sum(r.usage.completion_tokens for r in results)
        rows.append({"choices": n, "mode": mode, "prompt_tokens": prompt, "wall_s": round(wall, 2),
                     "prompt_tokens_computed": stats["tokens_computed"] - (generated - n),
                     "cached_tokens_total": sum(r.usage.cached_tokens for r in results),
                     "peak_blocks": stats["blocks"]["peak_blocks_used"],
                     "ttft_p50_s": round(p50([r.timings.ttft_s for r in results]), 3),
                     "ttft_max_s": round(max(r.timings.ttft_s for r in results), 3)})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--sequences", type=int, nargs="+", default=[1, 2, 4, 8, 16])
    parser.add_argument("--lengths", type=int, nargs="+", default=[17, 33, 65, 129],
                        help="request lengths of the reservation part")
    parser.add_argument("--reserve", type=int, default=256, help="contiguous slots reserved per request")
    parser.add_argument("--real-sharing", type=int, default=4, help="0 to skip")
    parser.add_argument("--choices", type=int, default=4, help="n of the choices part; 0 to skip")
    parser.add_argument("--only-choices", action="store_true", help="run only the choices part")
    parser.add_argument("--output", default=str(RESULTS / "paged_generation.csv"))
    args = parser.parse_args()
    settings = load_settings()
    engine = Engine(settings).load()
    print(machine_line(engine.loaded.dtype), f"model {engine.loaded.name}")
    out = Path(args.output)
    if args.choices:
        rows = choices(engine, args.choices, 16)
        print(f"\nn = {args.choices} choices of one prompt: one group vs separate requests:")
        print_table(rows)
        write_csv(out.with_name(out.stem + "_choices.csv"), rows)
    if args.only_choices:
        return
    speed = decode_speed(engine, args.repeats, args.new_tokens)
    print(f"\ndecode speed, {args.new_tokens} new tokens, greedy:")
    print_table(speed)
    booked, booked_summary = reservation(args.lengths, settings.kv_block_size, args.reserve,
                                         kv_bytes_per_token(engine))
    print(f"\nKV slots per request, paged blocks vs contiguous reserving {args.reserve}:")
    print_table(booked)
    print(", ".join(f"{key} {value}" for key, value in booked_summary.items()))
    mem, system_tokens = memory(engine, args.sequences, settings.kv_block_size)
    print(f"\nKV held by N sequences sharing a {system_tokens}-token system prompt "
          f"(block {settings.kv_block_size}):")
    print_table(mem)
    write_csv(out, speed)
    write_json(out.with_suffix(".machine.json"), machine_info() | {"model": engine.loaded.name, "args": vars(args)})
    write_csv(out.with_name(out.stem + "_memory.csv"), mem)
    write_json(out.with_name(out.stem + "_reservation.json"), {"rows": booked, "summary": booked_summary})
    if args.real_sharing:
        real = real_sharing(engine, args.real_sharing, 16)
        print(f"\n{args.real_sharing} real requests over the shared system prompt:")
        print_table(real)
        write_csv(out.with_name(out.stem + "_sharing_run.csv"), real)
    plot(speed, mem, out.with_suffix(".png"))
    print(f"wrote {out}, {out.with_name(out.stem + '_memory.csv')}, "
          f"{out.with_name(out.stem + '_reservation.json')}, {out.with_suffix('.png')}")


def plot(speed, mem, path) -> None:
    plt = pyplot()
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 3.8))
    a.bar([r["method"] for r in speed], [r["decode_tok_s_p50"] for r in speed])
    a.set_ylabel("decode tokens/s (p50)")
    a.set_title("paged vs custom_cache")
    for sharing, label in ((False, "no sharing"), (True, "prefix sharing")):
        pts = [(r["sequences"], r["kv_mib"]) for r in mem if r["prefix_sharing"] == sharing]
        b.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=label)
    b.set_xlabel("concurrent sequences")
    b.set_ylabel("KV MiB held")
    b.set_title("Shared 1,000-token system prompt")
    b.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    main()
