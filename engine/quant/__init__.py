"""Weight-only int8 / int4 quantization for the hand-written forward (``MINISERVE_QUANT``).

``quantize_model(model, mode)`` runs once at load (engine.loader); the forward gets its
weights from ``forward_weights(model)`` (engine.handwritten). See docs/quantization.md for
kernels, accuracy, speed and memory.
"""
from engine.quant.kernels import QuantKernelError, check_kernels
from engine.quant.layer import (DEFAULT_GROUP_SIZE, DEFAULT_MAX_ROWS, QUANT_MODES, QuantizedLinear,
                                quantize_linear)
from engine.quant.model import (QuantSummary, forward_weights, quantize_model, quantize_weights,
                                quantized_bytes)

__all__ = [
    "DEFAULT_GROUP_SIZE", "DEFAULT_MAX_ROWS", "QUANT_MODES", "QuantKernelError", "QuantSummary",
    "QuantizedLinear", "check_kernels", "forward_weights", "quantize_linear", "quantize_model",
    "quantize_weights", "quantized_bytes",
]
