"""Weight-only low-bit quantization for the hand-written forward (``MINISERVE_QUANT``).

``engine.quant.model.quantize_model(model, plan)`` runs once at load (engine.loader); the
forward gets its weights from ``engine.quant.model.forward_weights(model)``. See
docs/quantization.md for the plan, kernel, accuracy, speed and memory.

The package re-exports nothing: import from its modules, so that importing one of them (the
kernel, say) does not import the rest (a re-exporting package ties its modules into a cycle).
"""
