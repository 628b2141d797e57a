"""Weight-only low-bit quantization for the hand-written forward (``MINISERVE_QUANT``).

``quantize_model(model, plan)`` runs once at load (engine.loader); the forward gets its
weights from ``forward_weights(model)`` (engine.handwritten). See docs/quantization.md for
plans, kernels, accuracy, speed and memory.
"""
from engine.quant.kernels import QuantKernelError, check_kernels
from engine.quant.layer import QuantizedLinear, quantize_linear
from engine.quant.model import (QuantSummary, bytes_per_token, exact_attention, forward_weights, pack_model,
                                quantize_model, quantize_weights, quantized_bytes)
from engine.quant.plan import AUTO_CPU_PLAN, PLANS, QUANT_CHOICES, QuantPlan, resolve_quant
from engine.quant.restore import full_weight_bytes, restore_full_weights

__all__ = [
    "AUTO_CPU_PLAN", "PLANS", "QUANT_CHOICES",
    "QuantKernelError", "QuantPlan", "QuantSummary", "QuantizedLinear", "bytes_per_token", "check_kernels",
    "exact_attention", "forward_weights",
    "full_weight_bytes", "pack_model", "quantize_linear", "quantize_model", "quantize_weights", "quantized_bytes",
    "resolve_quant", "restore_full_weights",
]
