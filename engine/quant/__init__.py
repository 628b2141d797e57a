"""Weight-only int8 / int4 quantization for the hand-written forward (``MINISERVE_QUANT``).

``quantize_model(model, mode)`` runs once at load; the forward calls ``linear(x, module)``
(or caches ``linear_op(module)``) for every projection and lm_head. See
docs/quantization.md for kernels, accuracy, speed and memory.
"""
from engine.quant.kernels import QuantKernelError, check_kernels
from engine.quant.layer import (DEFAULT_GROUP_SIZE, DEFAULT_MAX_ROWS, QUANT_MODES, QuantizedLinear,
                                 quantize_linear)
from engine.quant.model import (QuantSummary, linear, linear_op, quantize_model, quantized_layer,
                                remove_quantization)

__all__ = [
    "DEFAULT_GROUP_SIZE", "DEFAULT_MAX_ROWS", "QUANT_MODES", "QuantKernelError", "QuantSummary",
    "QuantizedLinear", "check_kernels", "linear", "linear_op", "quantize_linear", "quantize_model",
    "quantized_layer", "remove_quantization",
]
