"""The forward's small operations -- RMSNorm, rotary, silu * up, the cache write + attention of
a few tokens, the paged write + gather -- in one place, behind one interface.

- :mod:`engine.ops.interface`: :class:`~engine.ops.interface.SmallOps`, what every
  implementation offers and what the forward and the caches call (with no branch of their own);
- :mod:`engine.ops.torch_ops`: torch's operations, the exact reference (``none``, float32, any
  device) and the base the others fall back to;
- :mod:`engine.ops.fused_ops` over :mod:`engine.ops.c_calls`: one C call per operation for a
  low-bit bf16 forward on CPU, with the attention in C too where it rounds like torch's;
- :mod:`engine.ops.choose`: the one decision, made once per forward from its weights and the
  CPU, and the whole-step kernel (:mod:`engine.quant.step`) it hands out where that applies.

The package re-exports nothing: importing one implementation must not import the chooser,
which sits a layer above (it reads the quantized weights).
"""
