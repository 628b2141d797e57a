"""Free the full-precision copies of quantized matrices; bring them back for ``official``.

A quantized worker decodes from the low-bit tensors only, so keeping the bf16 matrices
beside them would double its memory (issue 12). :func:`free_full_weights` swaps each
quantized ``nn.Linear`` weight of the transformers model for an empty placeholder and drops
the fused buffers of :func:`engine.weights.fuse_projections`. ``official`` must still work:
a forward pre-hook on the model reloads those weights from the model's safetensors (or,
for a hub id without local files, from ``from_pretrained``) the first time transformers
runs it, then removes itself. Parameter accounting (:func:`full_weight_bytes`) lets tests
check that nothing full-precision is left behind.

Why free them again after ``official`` (:func:`full_weights`): a reload kept for the rest of
the process made a worker that ever served one ``official`` job hold both copies for good
(about 1 GB more for the default model). Each ``official`` job now reloads them (logged as
``full_weights_restored`` with its latency) and the last one running frees them, handing the
pages back to the OS; ``MINISERVE_OFFICIAL_KEEP_WEIGHTS=true`` keeps them after the first.

Why the files are read on a helper thread: ``official`` runs as a solo task on the engine
loop's thread, and reading and converting about 1 GB of safetensors took 0.7 s there, a stall
of every other stream. Given the task's ``pause`` (``full_weights(..., wait=run.pause)``), the
read runs on a loader thread that touches no engine state (it only builds new tensors) while
the task hands the loop back each turn; the new tensors are swapped into the modules on the
loop thread once they are in.
"""
from __future__ import annotations

import concurrent.futures as futures
import logging
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator

import torch

from core.logs import log_event
from engine.packed import release_freed_memory

logger = logging.getLogger("miniserve.engine.quant")
_STATE = "miniserve_freed_weights"  # {"names": [...], "source": str, "hook": handle, "lock": Lock}
_ATTN = ("q_proj", "k_proj", "v_proj", "o_proj")
_MLP = ("gate_proj", "up_proj", "down_proj")
_LOADER = futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="miniserve-weights")
_POLL_S = 0.002  # how long a waiting task holds the loop per turn: far under a decode step


def quantized_modules(model: Any, embed: bool = False) -> dict[str, torch.nn.Module]:
    """The modules whose weights the quantized forward replaces, by state-dict name (the
    embedding too when ``embed``: a quantized table)."""
    out = {"model.embed_tokens": model.model.embed_tokens} if embed else {}
    for i, layer in enumerate(model.model.layers):
        out.update({f"model.layers.{i}.self_attn.{n}": getattr(layer.self_attn, n) for n in _ATTN})
        out.update({f"model.layers.{i}.mlp.{n}": getattr(layer.mlp, n) for n in _MLP})
    if model.lm_head.weight is not model.model.embed_tokens.weight:  # a tied head is the embedding
        out["lm_head"] = model.lm_head
    return out


def full_weight_bytes(model: Any, embed: bool = False) -> int:
    """Bytes of full-precision weight still held by the quantized modules (0 once freed)."""
    return sum(m.weight.numel() * m.weight.element_size() for m in quantized_modules(model, embed).values())


def register_reload(model: Any, params: list[str], read: Callable[[], dict[str, torch.Tensor]]) -> None:
    """A model whose parameters ``params`` (full state-dict names) are not in memory (left on
    the ``meta`` device: a GGUF run on its own bits) until ``official`` asks for them: ``read``
    returns them then, by name (it may refuse, e.g. for want of memory: the job fails with its
    error). :func:`full_weights` frees them again after, as for a quantized model."""
    model.__dict__[_STATE] = {"names": [], "params": list(params), "read": read, "source": None,
                              "lock": threading.Lock(), "users": 0, "hook": _reload_hook(model)}


def _free_params(model: Any, state: dict[str, Any]) -> int:
    """Put a :func:`register_reload` model's parameters back on the meta device (no memory)."""
    freed = 0
    for name in state["params"]:
        old = model.get_parameter(name)
        if not old.is_meta:
            freed += old.numel() * old.element_size()
        _set_param(model, name, torch.empty(old.shape, dtype=old.dtype, device="meta"))
    _retie(model)
    if state.get("done"):
        state.update(done=False, hook=_reload_hook(model))
    return freed


def _set_param(model: Any, name: str, tensor: torch.Tensor) -> None:
    owner, _, attr = name.rpartition(".")
    setattr(model.get_submodule(owner), attr, torch.nn.Parameter(tensor))


def _retie(model: Any) -> None:
    """A tied head is the embedding's parameter itself (replacing one must not untie them)."""
    if getattr(model.config, "tie_word_embeddings", False):
        model.lm_head.weight = model.model.embed_tokens.weight


def free_full_weights(model: Any, source: str | None, embed: bool = False) -> int:
    """Release the quantized modules' weights (and fused buffers); returns bytes freed."""
    state = model.__dict__.get(_STATE)
    if state is not None and "params" in state:
        return _free_params(model, state)
    if source is None:
        raise ValueError("freeing full-precision weights needs the model source to reload them for official")
    modules = quantized_modules(model, embed)
    freed = full_weight_bytes(model, embed)
    for module in modules.values():
        module.__dict__.pop("_miniserve_fused", None)
        dtype, device = module.weight.dtype, module.weight.device
        module.weight = torch.nn.Parameter(torch.empty(0, dtype=dtype, device=device), requires_grad=False)
    state = model.__dict__.get(_STATE)
    if state is None:
        model.__dict__[_STATE] = {"names": list(modules), "source": source, "lock": threading.Lock(), "users": 0,
                                  "hook": _reload_hook(model)}
    elif state.get("done"):   # freed again after official: the next forward reloads once more
        state.update(done=False, hook=_reload_hook(model))
    return freed


def _reload_hook(model: Any) -> Any:
    return model.register_forward_pre_hook(lambda module, args: restore_full_weights(module))


@contextmanager
def full_weights(model: Any, keep: bool = False, wait: Callable[[], None] | None = None) -> Iterator[None]:
    """The full-precision weights for the duration of the block (``official``'s ``generate``);
    freed again when the last block that asked for them ends, unless ``keep``. Blocks may
    overlap (solo tasks interleave on the loop thread): a count of users decides. ``wait``:
    see :func:`restore_full_weights`."""
    state = model.__dict__.get(_STATE)
    if state is None:   # nothing was freed (full precision, or not packed): nothing to do
        yield
        return
    state["users"] += 1
    try:
        restore_full_weights(model, wait)
        yield
    finally:
        state["users"] -= 1
        if state["users"] == 0 and not state.get("done"):
            state.pop("loading", None)  # every asker was cancelled: let an unfinished read go
        if not keep and state["users"] == 0 and state.get("done"):
            freed = free_full_weights(model, state["source"], embed="model.embed_tokens" in state["names"])
            release_freed_memory()
            log_event(logger, "full_weights_freed", reason="official_done", mb=round(freed / 2**20, 1))


def restore_full_weights(model: Any, wait: Callable[[], None] | None = None) -> None:
    """Reload the freed weights (once; later calls return at once).

    Without ``wait`` the files are read here, under a lock (thread-safe). With ``wait`` (a solo
    task's pause, so only ever on the loop thread) they are read on the loader thread, shared
    by every task that asks meanwhile, and ``wait`` is called until they are in."""
    state = model.__dict__.get(_STATE)
    if state is None or state.get("done"):
        return
    started = time.perf_counter()
    if wait is None:
        with state["lock"]:
            if not state.get("done"):
                _install(model, state, _read(model, state), started)
        return
    loading = state.get("loading") or state.setdefault("loading", _LOADER.submit(_read, model, state))
    await_loader(loading, wait)
    if state.get("loading") is loading:
        del state["loading"]    # a failed read is tried afresh by the next job
    tensors = loading.result()  # the read's error, if any, fails this job
    with state["lock"]:
        if not state.get("done"):
            _install(model, state, tensors, started)


def on_loader(work: Callable[[], Any]) -> futures.Future:
    """``work`` on the loader thread (one at a time, in order)."""
    return _LOADER.submit(work)


def await_loader(future: futures.Future, wait: Callable[[], None]) -> None:
    """Call ``wait`` (a solo task's pause) until ``future`` is done: the loop's other streams
    go on, and the task is resumed on a later turn."""
    while not future.done():
        wait()
        futures.wait([future], timeout=_POLL_S)


def _read(model: Any, state: dict[str, Any]) -> dict[str, torch.Tensor]:
    """The freed weights as new tensors on the model's device; touches nothing of the model."""
    if "read" in state:
        with torch.inference_mode(False):
            return state["read"]()
    dtype, device = model.model.norm.weight.dtype, model.model.norm.weight.device
    with torch.inference_mode(False):  # see _install: plain tensors, as from_pretrained leaves them
        tensors = _load(state["source"], [f"{name}.weight" for name in state["names"]], dtype)
        return {key: t.to(device) for key, t in tensors.items()}


def _install(model: Any, state: dict[str, Any], tensors: dict[str, torch.Tensor], started: float) -> None:
    if "params" in state:
        with torch.inference_mode(False):
            for name in state["params"]:
                _set_param(model, name, tensors[name])
            _retie(model)
        _installed(state, tensors, started)
        return
    modules = quantized_modules(model, embed="model.embed_tokens" in state["names"])
    # Plain tensors with requires_grad, as from_pretrained leaves them (grad mode is off
    # anyway), even when the hook fires inside inference_mode: transformers' generate over
    # inference-tensor weights, or with requires_grad=False (torch's matmul then does not
    # fold the sliced [batch, 1, hidden] prefill input for lm_head and multiplies an 8x
    # expanded copy of the head), ran 3-5x slower on the padded-batch benchmark.
    with torch.inference_mode(False):
        for name in state["names"]:
            modules[name].weight = torch.nn.Parameter(tensors[f"{name}.weight"])
    _installed(state, tensors, started)


def _installed(state: dict[str, Any], tensors: dict[str, torch.Tensor], started: float) -> None:
    state["hook"].remove()
    state["done"] = True
    log_event(logger, "full_weights_restored", reason="official", tensors=len(tensors),
              mb=round(sum(t.numel() * t.element_size() for t in tensors.values()) / 2**20, 1),
              latency_ms=int((time.perf_counter() - started) * 1000))


def _load(source: str, keys: list[str], dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """``keys`` from the safetensors files of the folder ``source``, else via from_pretrained."""
    files = sorted(Path(source).glob("*.safetensors")) if Path(source).is_dir() else []
    wanted, out = set(keys), {}
    if files:
        from safetensors import safe_open

        for path in files:
            with safe_open(str(path), framework="pt") as handle:
                for key in wanted.intersection(handle.keys()):
                    out[key] = handle.get_tensor(key).to(dtype)
    if wanted - set(out):
        from transformers import AutoModelForCausalLM

        state = AutoModelForCausalLM.from_pretrained(source, dtype=dtype).state_dict()
        out.update({k: state[k].detach().clone() for k in wanted - set(out)})
    return out
