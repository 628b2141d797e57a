"""The prefix cache's side channel, probed through the web: can one API key learn what
another sent from ``cached_tokens``?

    python -m bench prefix_cache --isolation [--model default]

A stack of its own (Redis, one worker, the web) with two API keys, run twice: with the
default (each key's cache is its own: block hashes salted with the key's owner id) and with
``MINISERVE_SHARE_PREFIX_CACHE_ACROSS_KEYS=true``. Three secrets, one per case, each a
system prompt of a few hundred tokens: key-b guesses a secret key-a never sent (*before*),
guesses exactly one key-a sent (*exact*), and guesses one key-a sent with its last sentence
changed (*near miss*). Reported: the ``cached_tokens`` key-b's ``/v1/chat/completions``
answer shows in each case. Isolated, the three must be equal (nothing to learn); shared,
an exact guess shows the secret's blocks. Writes ``results/cache_isolation.json``.
"""
from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import requests

from bench.local_stack import serving_stack
from bench.stats import machine_info, print_table, write_json

KEYS = {"key-a": {"Authorization": "Bearer key-a"}, "key-b": {"Authorization": "Bearer key-b"}}
CASES = ("before", "exact", "near miss")
NOTE = ("Internal note {n}: the launch code for project {n} is {code}. Staff must never reveal it. "
        "Answer questions about the weather only. ")


def secret(n: int) -> str:
    return "".join(NOTE.format(n=n, code=f"{n * 7919:06d}-{i}") for i in range(8))


def _cached(base: str, key: str, system: str) -> int:
    body = {"model": "default", "max_tokens": 1, "messages": [
        {"role": "system", "content": system}, {"role": "user", "content": "What is the weather?"}]}
    reply = requests.post(f"{base}/v1/chat/completions", json=body, headers=KEYS[key], timeout=300)
    reply.raise_for_status()
    return int(reply.json()["usage"]["prompt_tokens_details"]["cached_tokens"])


def probe(base: str) -> dict[str, int]:
    """key-b's ``cached_tokens`` in each case (each case its own secret, so key-b's own
    earlier requests cannot be what hits)."""
    _cached(base, "key-a", secret(2))
    _cached(base, "key-a", secret(3))
    near = secret(3)[:-len(NOTE)] + "Answer questions about the tides only. "
    return {"before": _cached(base, "key-b", secret(1)), "exact": _cached(base, "key-b", secret(2)),
            "near miss": _cached(base, "key-b", near)}


def main(args: argparse.Namespace) -> int:
    rows: list[dict[str, Any]] = []
    for shared in (False, True):
        env = {"MINISERVE_MODEL": args.model, "MINISERVE_API_KEYS": ",".join(KEYS),
               "MINISERVE_SHARE_PREFIX_CACHE_ACROSS_KEYS": str(shared).lower()}
        with serving_stack(env) as base:
            seen = probe(base)
        rows.append({"cache": "shared across keys" if shared else "per key (default)", **seen,
                     "leaks": len(set(seen.values())) > 1})
        print_table([rows[-1]], list(rows[-1]))
    write_json(Path(args.out) / "cache_isolation.json", {
        "command": f"python -m bench prefix_cache --isolation --model {args.model}", "machine": machine_info(),
        "cases": list(CASES), "rows": rows})
    return 0 if not rows[0]["leaks"] else 1
