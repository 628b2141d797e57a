"""The hand-written generation methods: ``no_cache``, ``custom_cache``, ``prefix_cache``.

All three run :class:`~engine.forward.Qwen2Forward` over the loaded model's own weights and
pick tokens with :class:`~engine.sampling.Sampler`; they differ only in where keys and
values live:

- ``no_cache``: every step feeds the whole sequence again (no KV kept).
- ``custom_cache``: prefill the prompt once into a :class:`ContiguousKVCache`, then one
  token per step.
- ``prefix_cache``: the prompt's system block (see :mod:`engine.prompt`) is looked up in the
  engine's :class:`PrefixCache`; a miss prefills the whole prompt and stores the prefix's
  KV, a hit copies it in and prefills only the rest in one batch; then decoding as
  ``custom_cache``.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch

from core.methods import CUSTOM_CACHE, NO_CACHE, PREFIX_CACHE
from core.prefix_hash import salted_root
from engine.constrained import run_constraint
from engine.forward import Qwen2Forward
from engine.kv_cache import ContiguousKVCache, NoCache
from engine.prefix_cache import PrefixCache
from engine.prompt import Prompt
from engine.run import GenerationRun
from engine.sampling import Sampler
from engine.speculative.config import spec_config
from engine.speculative.contiguous import speculative_decode_loop
from engine.speculative.counters import spec_counters
from engine.speculative.policy import SpecState
from engine.types import GenerationRequest
from engine.quant.model import forward_weights


def forward_for(engine: Any) -> Qwen2Forward:
    """The engine's forward over its model (built once; fuses projections in place).

    Quantization hook: ``forward_weights`` returns the int8/int4 projections made at load
    when ``MINISERVE_QUANT != none``, else the model's own fused weights."""
    return engine.state("forward", lambda: Qwen2Forward(forward_weights(engine.loaded.model)))


def prefix_store(engine: Any) -> PrefixCache:
    settings = engine.settings
    return engine.state("prefix_cache", lambda: PrefixCache(settings.prefix_cache_max_entries,
                                                            settings.prefix_cache_max_tokens))


def _sampler(engine: Any, forward: Qwen2Forward, request: GenerationRequest, penalty: float,
             prompt: Prompt, run: GenerationRun) -> Sampler:
    return Sampler(request.sampling, penalty, forward.config.vocab_size, prompt.ids, forward.weights.device,
                   constraint=run_constraint(engine, run, request.constraint), record=run.logprobs,
                   eos_ids=run.eos_ids, resumed=run.token_ids[:run.resumed])


def decode_loop(forward: Qwen2Forward, cache: Any, logits: torch.Tensor, sampler: Sampler,
                run: GenerationRun) -> None:
    """Sample from ``logits``, feed the token back one at a time until the run stops."""
    token_buf = torch.empty(1, dtype=torch.long, device=forward.weights.device)
    while True:
        token = sampler(logits)
        if run.accept(token):
            return
        token_buf.fill_(token)
        logits = forward(token_buf, cache)


def run_no_cache(engine: Any, prompt: Prompt, run: GenerationRun, request: GenerationRequest, penalty: float) -> int:
    forward = forward_for(engine)
    sampler = _sampler(engine, forward, request, penalty, prompt, run)
    ids = list(prompt.ids)
    device = forward.weights.device
    with torch.inference_mode():
        if run.cancelled():
            return 0
        while True:
            logits = forward(torch.tensor(ids, dtype=torch.long, device=device), NoCache())
            token = sampler(logits)
            if run.accept(token):
                return 0
            ids.append(token)


def _new_cache(forward: Qwen2Forward, prompt: Prompt, request: GenerationRequest,
               extra: int = 0) -> ContiguousKVCache:
    """Sized for the whole request; ``extra`` room for drafts verified past the last token."""
    capacity = len(prompt.ids) + request.sampling.max_new_tokens + extra
    return ContiguousKVCache(forward.config, capacity, forward.weights.dtype, forward.weights.device, ops=forward.ops)


@dataclass(frozen=True)
class PrefillChunks:
    """A long prompt is prefilled in chunks, handing the loop back between them (``pause``,
    set for a solo job by the loop), so a long prompt on these methods never holds the loop
    and the others' streams for its whole prefill. How many tokens a chunk may take comes
    from ``take`` (the loop's per-turn budget, shared by every solo task: at most
    ``MINISERVE_MAX_BATCHED_TOKENS`` prompt tokens a turn); without it, ``budget`` a chunk
    (0: one pass)."""

    budget: int = 0
    pause: Callable[[], None] | None = None
    stopped: Callable[[], bool] | None = None  # the run was cancelled: the rest is not computed
    take: Callable[[int], int] | None = None

    def run(self, forward: Qwen2Forward, ids: torch.Tensor, cache: Any) -> torch.Tensor:
        total = ids.numel()
        if self.pause is None or (self.take is None and (self.budget <= 0 or total <= self.budget)):
            return forward(ids, cache)
        start, logits = 0, None
        while start < total:
            granted = self._grant(total - start)
            if granted == 0:          # the turn's budget is spent: wait for the next turn
                self.pause()
                continue
            logits = forward(ids[start:start + granted], cache)
            start += granted
            if start < total:
                self.pause()
                if self.stopped is not None and self.stopped():
                    break
        return logits

    def _grant(self, wanted: int) -> int:
        if self.take is not None:
            return self.take(wanted)
        return min(wanted, self.budget)


def _run_cached(engine: Any, prompt: Prompt, run: GenerationRun, request: GenerationRequest, penalty: float,
                prefill: Callable[[Qwen2Forward, Prompt, ContiguousKVCache, PrefillChunks],
                                  tuple[torch.Tensor, int]]) -> int:
    """Prefill into a fresh contiguous cache with ``prefill``, then decode; returns cached tokens."""
    forward = forward_for(engine)
    sampler = _sampler(engine, forward, request, penalty, prompt, run)
    # a constrained request does not draft: drafts are not checked against the grammar
    spec = spec_config(engine.settings, request.speculative, forward.weights) if request.constraint is None else None
    with torch.inference_mode():
        if run.cancelled():
            return 0
        cache = _new_cache(forward, prompt, request, spec.num_tokens + 1 if spec else 0)
        chunks = PrefillChunks(engine.settings.max_batched_tokens, run.pause, run.cancelled, run.prefill_allowance)
        logits, cached = prefill(forward, prompt, cache, chunks)
        if spec is None:
            decode_loop(forward, cache, logits, sampler, run)
        else:
            state = SpecState.start(spec, prompt.ids)
            speculative_decode_loop(forward, cache, logits, sampler, run, state)
            spec_counters(engine).add(run.draft_tokens, run.accepted_draft_tokens)
    return cached


def prefill_all(forward: Qwen2Forward, prompt: Prompt, cache: ContiguousKVCache,
                chunks: PrefillChunks = PrefillChunks()) -> tuple[torch.Tensor, int]:
    """The whole prompt (in chunks when long); (last-position logits, 0 cached tokens)."""
    return chunks.run(forward, torch.tensor(prompt.ids, dtype=torch.long, device=forward.weights.device), cache), 0


def run_custom_cache(engine: Any, prompt: Prompt, run: GenerationRun, request: GenerationRequest,
                     penalty: float) -> int:
    return _run_cached(engine, prompt, run, request, penalty, prefill_all)


def prefill_with_prefix(forward: Qwen2Forward, store: PrefixCache, prompt: Prompt,
                        cache: ContiguousKVCache, salt: str = "",
                        chunks: PrefillChunks = PrefillChunks()) -> tuple[torch.Tensor, int]:
    """Fill ``cache`` with the prompt, reusing or storing its system block.

    Miss: the whole prompt in one pass (exactly what ``custom_cache`` does), then a compact copy
    of the prefix positions goes into the store. Hit: the stored prefix is copied in and only
    the rest of the prompt is computed. Returns (last-position logits, cached tokens). A
    ``salt`` (the request's cache scope) is part of the key: other scopes never hit it.
    """
    device = forward.weights.device
    prefix = prompt.prefix_ids
    key = (salted_root(salt), *prefix) if salt and prefix else prefix
    entry = store.get(key) if prefix else None
    if entry is None:
        logits, _ = prefill_all(forward, prompt, cache, chunks)
        if prefix:
            store.put(key, *cache.snapshot(len(prefix)))
        return logits, 0
    cache.load(entry.keys, entry.values)
    rest = torch.tensor(prompt.ids[len(prefix):], dtype=torch.long, device=device)
    return chunks.run(forward, rest, cache), entry.tokens


def run_prefix_cache(engine: Any, prompt: Prompt, run: GenerationRun, request: GenerationRequest,
                     penalty: float) -> int:
    store = prefix_store(engine)
    return _run_cached(engine, prompt, run, request, penalty,
                       lambda forward, prompt_, cache, chunks: prefill_with_prefix(
                           forward, store, prompt_, cache, request.cache_salt, chunks))


def handwritten_methods() -> dict[str, Callable[..., int]]:
    return {NO_CACHE: run_no_cache, CUSTOM_CACHE: run_custom_cache, PREFIX_CACHE: run_prefix_cache}
