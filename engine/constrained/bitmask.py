"""Applying a grammar's token bitmask to logits, the same way for every grammar library.

Both xgrammar and llguidance describe the allowed next tokens as a packed bitmask: int32
words, bit ``i % 32`` of word ``i // 32`` set when token ``i`` may come next. The sampler
needs it as "-inf where forbidden" over the model's vocabulary (which can be longer than the
tokenizer's: Qwen2.5 pads 151,665 tokens to 151,936 logits). Unpacking with numpy's
``unpackbits`` is a single pass over ~19 KB, far cheaper than a torch shift-and-mask over
151k int32s on a CPU.
"""
from __future__ import annotations

import numpy as np
import torch


def words_for(vocab_size: int) -> int:
    """int32 words a bitmask over ``vocab_size`` tokens takes."""
    return (vocab_size + 31) // 32


def allowed_tokens(bitmask: torch.Tensor | np.ndarray, vocab_size: int) -> torch.Tensor:
    """A bool tensor ``[vocab_size]``: True where the bitmask allows the token (ids past the
    bitmask's end are forbidden)."""
    words = bitmask.numpy() if isinstance(bitmask, torch.Tensor) else np.asarray(bitmask)
    bits = np.unpackbits(np.ascontiguousarray(words).view(np.uint8), bitorder="little")
    allowed = np.zeros(vocab_size, dtype=bool)
    n = min(vocab_size, bits.shape[0])
    allowed[:n] = bits[:n].view(bool)
    return torch.from_numpy(allowed)


def apply_bitmask(logits: torch.Tensor, bitmask: torch.Tensor | np.ndarray) -> torch.Tensor:
    """``logits [vocab]`` with every token the bitmask forbids set to -inf (a new tensor)."""
    allowed = allowed_tokens(bitmask, logits.shape[-1]).to(logits.device)
    return logits.masked_fill(~allowed, float("-inf"))
