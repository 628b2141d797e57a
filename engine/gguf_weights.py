"""A quantized GGUF's weights arranged for the hand-written forward, read from the mapped file.

:func:`read_gguf_weights` maps the file read-only (:mod:`engine.gguf_index`, an
``np.memmap``): every tensor's data is a view of the mapping, and ``torch.from_numpy`` on it copies nothing.
So the projections, ``lm_head`` and the embedding are the file's own bytes, paged in as a
step reads them (:class:`~engine.quant.gguf_linear.BlockLinear`,
:class:`~engine.quant.gguf_linear.BlockEmbedding`); only the norms and biases, a few hundred
KB, are copied (norms in the model dtype, biases in float32 as the linear adds them).

One exception: llama.cpp's converter permutes the rows of a Llama model's ``attn_q`` and
``attn_k`` (weights and biases) for its rotary layout, and transformers' GGUF loader undoes it
(``LlamaTensorProcessor``). Our forward rotates as transformers does, so those rows are put
back: a row permutation keeps every block whole, so the permuted tensors are heap copies of the
same bytes (about 15% of a Llama file), never a full-precision matrix.

The fused projections of the forward (q/k/v, gate/up) are one :class:`BlockLinear` each whose
parts are the separate tensors, whatever their types.

A second exception: a matrix in a format this CPU's kernels read interleaved
(:data:`engine.quant.gguf_native.INTERLEAVED_BY_PATH`: Q4_K, Q6_K, Q5_0 and Q8_0 on AVX512-VNNI,
Q5_0 and Q4_K on AVX2) whose rows come in groups of 16 is interleaved by 16 rows (the same
bytes in new places, moved slab by slab) into a cache file that this and every later start
maps (:mod:`engine.quant.interleaved_cache`; into huge-page memory where that file cannot be
written), and its pages of the GGUF's mapping are dropped from the process
(:meth:`GGUFIndex.release`), so the load's peak stays about one copy of those bytes. llama.cpp does the same for Q4_K (its
``CPU_REPACK`` buffer). The decode kernel then reads 8 or 16 rows per instruction: at batch 1
Q4_K's needed about half the instructions per byte on AVX-512.
"""
from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import numpy as np
import torch
from gguf import GGMLQuantizationType

from engine.architecture import UnsupportedArchitecture
from engine.errors import ModelLoadError
from engine.gguf_index import GGUFIndex, TensorInfo, read_index
from engine.huge_pages import HugePageArena
from engine.quant.gguf_blocks import BLOCK_TYPES, BlockWeight
from engine.quant import gguf_native
from engine.quant.gguf_native import K_FORMATS
from engine.quant.gguf_linear import BlockEmbedding, BlockLinear, Part
from engine.quant.interleaved_cache import ALIGN, InterleavedCache
from engine.weights import ForwardConfig, LayerWeights, Qwen2Weights

FLOAT_TYPES = frozenset({GGMLQuantizationType.F32, GGMLQuantizationType.F16, GGMLQuantizationType.BF16})
# GGUF architectures whose q/k rows llama.cpp's converter permuted (as transformers' TENSOR_PROCESSORS)
PERMUTED_ARCHITECTURES = ("llama",)
INTERLEAVE_SLAB_ROWS = 4096   # rows moved between releases of their mapped pages (a multiple of 16)


class GGUFWeightsError(ModelLoadError):
    """A GGUF whose tensors the native path cannot run (a type, a missing or misshaped tensor)."""


def weight_types(index: GGUFIndex) -> dict[str, GGMLQuantizationType]:
    """Every matrix's type (2-D tensors: the projections, the embedding and the head)."""
    return {t.name: t.ggml_type for t in index.tensors.values() if len(t.dims) == 2}


def native_refusal(index: GGUFIndex) -> str | None:
    """Why this file's matrices cannot run on their own bits (a type we have no kernel for, or
    no block-quantized matrix at all), or None when they can."""
    types = weight_types(index)
    unknown = sorted({t.name for t in types.values()} - {t.name for t in BLOCK_TYPES | FLOAT_TYPES})
    if unknown:
        return (f"its matrices include type(s) {', '.join(unknown)}; the native path runs "
                f"{', '.join(sorted(t.name for t in BLOCK_TYPES))} (and F32/F16/BF16)")
    if not any(t in BLOCK_TYPES for t in types.values()):
        return "no matrix is block-quantized (an F16/BF16/F32 file is the q8 path's)"
    return None


# ``auto``'s choice (docs/quantization.md, "`auto`", with the measured figures): on files of
# mostly K formats (Q4_K_M at 1.5B and up) the native path is much faster than q8 and needs a
# fraction of its load memory. On files of mostly 32-input blocks (the 0.5B shape, the bundled
# default) q8 was ahead before Q5_0/Q8_0 ran interleaved; on AVX512-VNNI CPUs gguf is now the
# faster there too, but q8's two-byte activations agree more often with the bf16 model, and
# at 0.5B its memory costs little, so auto keeps q8 for them.
K_SHARE_FOR_AUTO = 0.5
# The q8 path's peak while it prepares a file, per parameter (a full-precision copy, then int8):
# 6.6 and 6.0 bytes on the Qwen2.5 0.5B and 1.5B shapes (results/model_sizes.json), rounded up.
Q8_PREPARE_BYTES_PER_PARAM = 7


def auto_declines(index: GGUFIndex, available: int | None) -> str | None:
    """Why ``auto`` leaves this runnable file to q8 (None: it runs on its own bits): less than
    :data:`K_SHARE_FOR_AUTO` of its block bytes are K formats, and q8's preparation fits in the
    ``available`` memory (a file too large for that runs natively whatever its types)."""
    matrices = [t for t in index.tensors.values() if len(t.dims) == 2 and t.ggml_type in BLOCK_TYPES]
    total = sum(t.nbytes for t in matrices)
    k_share = sum(t.nbytes for t in matrices if t.ggml_type in K_FORMATS) / max(1, total)
    if k_share >= K_SHARE_FOR_AUTO:
        return None
    params = sum(int(np.prod(t.dims)) for t in index.tensors.values())
    if available is not None and params * Q8_PREPARE_BYTES_PER_PARAM > available:
        return None
    return f"{k_share:.0%} of its block bytes are K formats (auto leaves 32-input blocks to q8)"


def _as_tensor(array: np.ndarray) -> torch.Tensor:
    """A torch view of a read-only mapped array (no copy; writing to it would fault, and nothing does)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # "The given NumPy array is not writable"
        return torch.from_numpy(array)


def head_permutation(rows: int, n_head: int) -> np.ndarray:
    """Row order that undoes llama.cpp's rotary permutation of a q (``n_head`` heads) or k
    (``n_kv_head``) matrix: new row ``h*2d + j*d + i`` is old row ``h*2d + 2i + j``
    (transformers' ``_reverse_permute_weights``)."""
    dim = rows // n_head // 2
    return np.arange(rows).reshape(n_head, dim, 2).swapaxes(1, 2).reshape(-1)


class GGUFTensors:
    """Tensors of one mapped GGUF by name, as parts for :class:`BlockLinear` or small float copies."""

    def __init__(self, index: GGUFIndex, cache_dir: Path | None = None) -> None:
        self.index = index
        self.permuted = index.architecture in PERMUTED_ARCHITECTURES
        self.cache_dir = cache_dir
        self._cache: InterleavedCache | None = None   # opened at the first interleaved matrix
        self._slab: torch.Tensor | None = None        # reused while writing the cache
        self.arena = HugePageArena()    # interleaved copies without a cache (engine.huge_pages: why)

    def has(self, name: str) -> bool:
        return name in self.index.tensors

    def _tensor(self, name: str) -> TensorInfo:
        tensor = self.index.tensors.get(name)
        if tensor is None:
            raise GGUFWeightsError(f"the GGUF has no tensor {name!r}")
        return tensor

    def _shaped(self, name: str, rows: int, cols: int) -> TensorInfo:
        tensor = self._tensor(name)
        if tensor.shape != (rows, cols):
            raise GGUFWeightsError(f"{name} is {list(tensor.shape)}, the config expects [{rows}, {cols}]")
        return tensor

    def part(self, name: str, rows: int, cols: int, heads: int | None = None) -> Part:
        """Matrix ``name`` (``[rows, cols]`` as transformers names it) as the file stores it: a
        :class:`BlockWeight` over the mapped bytes, or a float view. ``heads``: undo llama.cpp's
        q/k row permutation (a heap copy of the same bytes)."""
        kind = self._shaped(name, rows, cols).ggml_type
        data = self.index.data(name)
        if heads is not None and self.permuted:
            data = data[head_permutation(rows, heads)]       # fancy indexing: a copy, rows whole
        if kind in BLOCK_TYPES:
            return BlockWeight(kind, rows, cols, _as_tensor(data))
        if kind in (GGMLQuantizationType.F32, GGMLQuantizationType.F16):
            return _as_tensor(data)
        if kind == GGMLQuantizationType.BF16:
            return _as_tensor(data).view(torch.bfloat16).reshape(rows, cols)
        raise GGUFWeightsError(f"{name} is {kind.name}, which the native path cannot run")

    def linear_part(self, name: str, rows: int, cols: int, heads: int | None = None) -> Part:
        """:meth:`part` for a matrix the forward multiplies (a projection, the head, a tied
        table): interleaved where this CPU's kernel reads that layout. An untied embedding is
        not: it is only looked up, a few rows at a time."""
        tensor = self._shaped(name, rows, cols)
        kind = tensor.ggml_type
        if kind not in BLOCK_TYPES or not gguf_native.interleaves(kind, rows):
            return self.part(name, rows, cols, heads)
        row_bytes = tensor.nbytes // rows
        cache = self._open_cache()
        moved = cache.lookup(name, int(kind), rows, row_bytes) if cache else None
        if moved is None:
            moved = self._interleave(name, self.part(name, rows, cols, heads))
        return BlockWeight(kind, rows, cols, moved, interleaved=True)

    def _interleave(self, name: str, part: BlockWeight) -> torch.Tensor:
        """``part``'s rows interleaved into the cache file being written, else into memory. Slab
        by slab, each slab's mapped pages dropped once moved: the load holds two copies of one
        slab at most, not of a whole tensor (a tied table is 200 MB at 1B)."""
        rows, cols = part.out_features, part.in_features
        moved = self._cache.add(name, int(part.ggml_type), rows, part.row_bytes) if self._cache else None
        to_file = moved is not None
        if not to_file:
            moved = self.arena.empty(tuple(part.data.shape))
        for start in range(0, rows, INTERLEAVE_SLAB_ROWS):
            stop = min(start + INTERLEAVE_SLAB_ROWS, rows)
            out = self._slab_of(stop - start, part.row_bytes) if to_file else moved[start:stop]
            gguf_native.repack_x16(part.data[start:stop], part.ggml_type, cols, out=out)
            if to_file:
                self._cache.append(out)
            self.index.release(name, start * part.row_bytes, stop * part.row_bytes)
        self.index.release(name)   # the pages that straddle two slabs
        return moved

    def _slab_of(self, rows: int, row_bytes: int) -> torch.Tensor:
        size = rows * row_bytes
        if self._slab is None or self._slab.numel() < size:
            self._slab = torch.empty(INTERLEAVE_SLAB_ROWS * row_bytes, dtype=torch.uint8)
        return self._slab[:size].view(rows, row_bytes)

    def _open_cache(self) -> InterleavedCache | None:
        if self._cache is None and self.cache_dir is not None:
            candidates = [t for t in self.index.tensors.values() if len(t.dims) == 2 and t.ggml_type in BLOCK_TYPES
                          and gguf_native.interleaves(t.ggml_type, t.shape[0])]
            capacity = sum(t.nbytes + ALIGN for t in candidates)
            self._cache = InterleavedCache.open(self.cache_dir, self.index.path, capacity)
            self.cache_dir = None   # opened once, or given up once
        return self._cache

    def finish(self, failed: bool = False) -> None:
        """The cache file put in place (or, for a failed load, given up). The interleaved
        weights written to it are readable from here on."""
        if self._cache is None:
            return
        if failed:
            self._cache.abandon()
        else:
            self._cache.finish()

    def vector(self, name: str, dtype: torch.dtype, size: int, heads: int | None = None) -> torch.Tensor:
        """A small 1-D tensor (norm or bias) copied to ``dtype``."""
        tensor = self._tensor(name)
        if tensor.ggml_type not in (GGMLQuantizationType.F32, GGMLQuantizationType.F16):
            raise GGUFWeightsError(f"{name} is {tensor.ggml_type.name}; a norm or bias must be F32 or F16")
        values = np.asarray(self.index.data(name), dtype=np.float32).reshape(-1)
        if values.shape != (size,):
            raise GGUFWeightsError(f"{name} has {values.shape[0]} values, the config expects {size}")
        if heads is not None and self.permuted:
            values = values[head_permutation(size, heads)]
        return torch.tensor(values, dtype=dtype)

    def optional_vector(self, name: str, dtype: torch.dtype, size: int, heads: int | None = None) -> torch.Tensor | None:
        return self.vector(name, dtype, size, heads) if self.has(name) else None


def read_gguf_weights(path: Path | str, config: Any, dtype: torch.dtype, cache_dir: Path | None = None) -> Qwen2Weights:
    """The forward's weights over the mapped file ``path``; ``config``: the transformers config
    the prepared folder holds (shapes and the architecture description). ``cache_dir``: where
    the interleaved matrices are kept between starts (:mod:`engine.quant.interleaved_cache`;
    None: interleaved in memory at every start)."""
    tensors = GGUFTensors(read_index(path), cache_dir)
    refusal = native_refusal(tensors.index)
    if refusal is not None:
        raise GGUFWeightsError(f"GGUF file {path} cannot run on its own bits: {refusal}")
    try:
        weights = _weights(tensors, config, dtype)
    except BaseException:
        tensors.finish(failed=True)
        raise
    tensors.finish()
    return weights


def _weights(tensors: GGUFTensors, config: Any, dtype: torch.dtype) -> Qwen2Weights:
    cfg = ForwardConfig.from_hf(config)
    layers = [_layer(tensors, cfg, i, dtype) for i in range(cfg.num_layers)]
    if not cfg.tied and not tensors.has("output.weight"):
        raise UnsupportedArchitecture("the GGUF has no output.weight but the config does not tie the head")
    # A tied table is the head's matrix too, read whole at every token: it takes the head's
    # layout, and lookups read their few rows from it (the dequantization reads both layouts).
    table = tensors.linear_part if cfg.tied else tensors.part
    embed_part = table("token_embd.weight", cfg.vocab_size, cfg.hidden_size)
    if cfg.tied:
        head = BlockLinear((embed_part,))
    else:
        head = BlockLinear((tensors.linear_part("output.weight", cfg.vocab_size, cfg.hidden_size),))
    return Qwen2Weights(config=cfg, embed=BlockEmbedding(embed_part, dtype), layers=layers,
                        norm=tensors.vector("output_norm.weight", dtype, cfg.hidden_size), lm_head=head)


def _layer(tensors: GGUFTensors, cfg: ForwardConfig, index: int, dtype: torch.dtype) -> LayerWeights:
    blk, hidden, inter = f"blk.{index}.", cfg.hidden_size, cfg.intermediate_size
    q, kv = cfg.q_size, cfg.kv_size
    heads = {"attn_q": (q, cfg.num_heads), "attn_k": (kv, cfg.num_kv_heads), "attn_v": (kv, None)}
    qkv_parts = tuple(tensors.linear_part(f"{blk}{n}.weight", rows, hidden, h) for n, (rows, h) in heads.items())
    qkv_bias = [tensors.optional_vector(f"{blk}{n}.bias", torch.float32, rows, h) for n, (rows, h) in heads.items()]
    if any(b is not None for b in qkv_bias) and any(b is None for b in qkv_bias):
        raise GGUFWeightsError(f"{blk}: some of q/k/v have a bias and some do not")
    spec = cfg.spec
    return LayerWeights(
        input_norm=tensors.vector(f"{blk}attn_norm.weight", dtype, hidden),
        qkv=BlockLinear(qkv_parts, None if qkv_bias[0] is None else torch.cat(qkv_bias)),
        o=BlockLinear((tensors.linear_part(f"{blk}attn_output.weight", hidden, q),),
                      tensors.optional_vector(f"{blk}attn_output.bias", torch.float32, hidden)),
        post_norm=tensors.vector(f"{blk}ffn_norm.weight", dtype, hidden),
        gate_up=BlockLinear((tensors.linear_part(f"{blk}ffn_gate.weight", inter, hidden),
                             tensors.linear_part(f"{blk}ffn_up.weight", inter, hidden)),
                            _pair_bias(tensors, blk, inter)),
        down=BlockLinear((tensors.linear_part(f"{blk}ffn_down.weight", hidden, inter),),
                         tensors.optional_vector(f"{blk}ffn_down.bias", torch.float32, hidden)),
        q_norm=tensors.vector(f"{blk}attn_q_norm.weight", dtype, cfg.head_dim) if spec.qk_norm else None,
        k_norm=tensors.vector(f"{blk}attn_k_norm.weight", dtype, cfg.head_dim) if spec.qk_norm else None)


def _pair_bias(tensors: GGUFTensors, blk: str, inter: int) -> torch.Tensor | None:
    gate = tensors.optional_vector(f"{blk}ffn_gate.bias", torch.float32, inter)
    up = tensors.optional_vector(f"{blk}ffn_up.bias", torch.float32, inter)
    if (gate is None) != (up is None):
        raise GGUFWeightsError(f"{blk}: one of ffn_gate/ffn_up has a bias and the other does not")
    return None if gate is None else torch.cat([gate, up])
