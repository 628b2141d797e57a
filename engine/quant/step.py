"""A decode (or verify) step of one sequence of a q8 or GGUF-native model in one C call
(``native/step.c``).

Why: a decode step spends most of its time reading weights in the C kernels, but each of its
~170 calls into C (a linear's wrapper and allocation, the fused small operations, a residual
add) costs Python and a fork/join of the thread team: ~2 ms of a ~19 ms ``q8`` step on a
2-core machine, more for ``gguf``, whose linears are one call per part. :class:`DecodeStep`
describes the model to C once (pointers into the loaded weights, or into the mapped GGUF file's
blocks, which it keeps alive) and then runs the whole step -- every layer, the final norm and
the head -- in one parallel region. The pieces are the same C functions in the same order, so
the logits equal the per-operation forward's bit for bit (tests/quant/test_step.py,
tests/quant/test_step_gguf.py).

Where it runs: a step of up to 16 consecutive tokens of one sequence (a decode token, a verify
step's pending token and drafts, a short chunk) of a forward whose every projection and head is
q8/q5 or GGUF block-format parts, and whose small operations attend in C
(:class:`engine.ops.fused_ops.CAttentionOps`): it is the whole-step kernel that the operations'
chooser hands out (:func:`engine.ops.choose.whole_step_for`). A contiguous cache
(engine.kv_cache), a lone paged sequence or a decode-only paged batch, one token per sequence
(engine.paged.forward) hands it the step. Other steps keep the Python forward.
"""
from __future__ import annotations

import ctypes
from typing import Any

import torch

from engine.ops import c_calls
from engine.quant import gguf_native, native, q8
from engine.quant.gguf_blocks import BlockWeight
from engine.quant.gguf_linear import BlockLinear
from engine.quant.layer import QuantizedLinear
from engine.quant.model import runs_gguf_blocks

_ptr, _i64 = ctypes.c_void_p, ctypes.c_int64


STOPPED = 4     # ms_decode_step's status when it stopped for an arrival
MAX_PARTS = 3   # step.c's MAX_PARTS: a fused q/k/v of three GGUF tensors


class _Part(ctypes.Structure):
    _fields_ = [("type", _i64), ("data", _ptr), ("row_bytes", _i64), ("rows", _i64)]


class _Linear(ctypes.Structure):
    _fields_ = [("weights", _ptr), ("scales", _ptr), ("bias", _ptr), ("in_features", _i64),
                ("out_features", _i64), ("q5", _i64), ("parts", _i64), ("part", _Part * MAX_PARTS)]


class _Layer(ctypes.Structure):
    _fields_ = [("input_norm", _ptr), ("post_norm", _ptr), ("qkv", _Linear), ("o", _Linear), ("gate_up", _Linear),
                ("down", _Linear)]


class _Model(ctypes.Structure):
    _fields_ = [("layers", _i64), ("hidden", _i64), ("heads", _i64), ("kv_heads", _i64), ("head_dim", _i64),
                ("intermediate", _i64), ("vocab", _i64), ("torch_lanes", _i64), ("gguf", _i64),
                ("eps", ctypes.c_float),
                ("layer", ctypes.POINTER(_Layer)), ("norm", _ptr), ("head", _Linear)]


def _runs_in_step(linear: Any, in_features: int) -> bool:
    """A q8/q5 linear whose input needs no padding (the step quantizes the row as it is), or a
    GGUF linear of at most MAX_PARTS block-format parts that gguf.c multiplies."""
    if isinstance(linear, BlockLinear):
        return _blocks_run_in_step(linear, in_features)
    return (isinstance(linear, QuantizedLinear) and linear.mode in q8.MODES and linear.in_features == in_features
            and linear.params.shape[1] * q8.GROUP == in_features and linear.qweight.is_contiguous()
            and linear.params.is_contiguous())


def _blocks_run_in_step(linear: BlockLinear, in_features: int) -> bool:
    bias = linear.bias
    if linear.in_features != in_features or len(linear.parts) > MAX_PARTS:
        return False
    if bias is not None and not (bias.dtype == torch.float32 and bias.is_contiguous()):
        return False
    return all(isinstance(part, BlockWeight) and part.ggml_type in gguf_native.TYPES and part.data.stride(1) == 1
               and part.data.device.type == "cpu" for part in linear.parts)  # BlockWeight: whole blocks


def _describe(linear: QuantizedLinear | BlockLinear) -> _Linear:
    if isinstance(linear, BlockLinear):
        bias = linear.bias
        parts = [_Part(p.kernel_type, p.data.data_ptr(), p.data.stride(0), p.out_features) for p in linear.parts]
        return _Linear(None, None, None if bias is None else bias.data_ptr(), linear.in_features,
                       linear.out_features, 0, len(parts), (_Part * MAX_PARTS)(*parts))
    bias = linear.kernel_bias
    return _Linear(linear.qweight.data_ptr(), linear.params.data_ptr(), None if bias is None else bias.data_ptr(),
                   linear.in_features, linear.out_features, int(linear.mode == "q5"))


def _norm(tensor: torch.Tensor) -> bool:
    return tensor.dtype == torch.bfloat16 and tensor.is_contiguous()


class DecodeStep:
    """The q8 model of ``weights`` as C sees it; ``step(...)`` runs a few tokens of one sequence."""

    def __init__(self, weights: Any) -> None:
        cfg = weights.config
        self.weights = weights   # keeps every pointer below alive
        self._layers = (_Layer * cfg.num_layers)(*[
            _Layer(layer.input_norm.data_ptr(), layer.post_norm.data_ptr(), _describe(layer.qkv), _describe(layer.o),
                   _describe(layer.gate_up), _describe(layer.down)) for layer in weights.layers])
        gguf = runs_gguf_blocks(weights)
        self._model = _Model(cfg.num_layers, cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim,
                             cfg.intermediate_size, weights.lm_head.out_features, c_calls.torch_sum_lanes(),
                             int(gguf), cfg.rms_eps,
                             self._layers, weights.norm.data_ptr(), _describe(weights.lm_head))
        self._call = native.library().ms_decode_step

    @staticmethod
    def supports(weights: Any) -> bool:
        """Whether every piece of a step of ``weights`` runs in step.c."""
        cfg = weights.config
        if not cfg.spec.c_step_ok:   # q/k norm or a sliding window: step.c computes neither
            return False
        if weights.dtype != torch.bfloat16 or weights.device.type != "cpu" or not _norm(weights.norm):
            return False
        hidden, inter, q_size = cfg.hidden_size, cfg.intermediate_size, cfg.q_size
        for layer in weights.layers:
            if not (_norm(layer.input_norm) and _norm(layer.post_norm) and _runs_in_step(layer.qkv, hidden)
                    and _runs_in_step(layer.o, q_size) and _runs_in_step(layer.gate_up, hidden)
                    and _runs_in_step(layer.down, inter)):
                return False
        return _runs_in_step(weights.lm_head, hidden) and cfg.num_heads // cfg.num_kv_heads <= 64

    def __call__(self, x: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, capacity: int,
                 table: torch.Tensor | None, block_size: int, position: int, cos: torch.Tensor,
                 sin: torch.Tensor, precise: bool = True, head_from: int = 0,
                 positions: torch.Tensor | None = None, arrived: int | None = None,
                 rank: int = 0) -> torch.Tensor | None:
        """float32 logits ``[n - head_from, vocab]`` of rows ``head_from..`` of ``n`` consecutive
        tokens of one sequence at ``position..``, whose embeddings are ``x [n, hidden]`` (bf16,
        overwritten). Their k/v go into a contiguous cache (``keys/values [layers, kv_heads,
        capacity, d]``, ``table`` None) or a paged pool read through the sequence's block
        ``table``. ``cos``/``sin``: their rotary rows (``[n, 1, d]``); ``precise``: two-byte
        activations (engine.quant.q8.linear's rule). ``positions`` (int64 ``[n]``): a decode-only
        batch of a paged pool instead, row ``t`` the one new token of its own sequence at
        ``positions[t]`` with block table ``table[t]`` (``table [n, max_blocks]``). ``arrived``:
        the address of an int32 read before each layer (engine.batching.arrivals); below
        ``rank``, the step stops and returns None."""
        x = x.contiguous()
        if positions is not None:
            positions = positions.to(torch.int64).contiguous()
            if table is None or table.dim() != 2 or table.shape[0] != x.shape[0] or positions.shape != (x.shape[0],):
                raise ValueError("a batch step takes one block table row and one position per row")
            table = table.contiguous()
        rows = x.shape[0]
        logits = torch.empty(rows - head_from, self._model.vocab, dtype=torch.float32)
        status = self._call(ctypes.byref(self._model), x.data_ptr(), rows, int(precise), keys.data_ptr(),
                            values.data_ptr(), capacity, None if table is None else table.data_ptr(), block_size,
                            position, cos.contiguous().data_ptr(), sin.contiguous().data_ptr(), head_from,
                            logits.data_ptr(), torch.get_num_threads(),
                            None if positions is None else positions.data_ptr(),
                            0 if positions is None else table.shape[1], arrived, rank)
        if status == STOPPED:
            return None
        if status != 0:
            raise RuntimeError(f"the one-call decode step failed with status {status}")
        return logits
