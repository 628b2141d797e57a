"""The packed bitmask -> -inf logits step, against a plain bit-by-bit reading."""
from __future__ import annotations

import numpy as np
import torch

from engine.constrained.bitmask import apply_bitmask, allowed_tokens, words_for


def reference(words: np.ndarray, vocab: int) -> list[bool]:
    return [i < 32 * len(words) and bool((int(words[i // 32]) >> (i % 32)) & 1) for i in range(vocab)]


def test_bits_are_read_in_token_order_and_ids_past_the_mask_are_forbidden():
    rng = np.random.default_rng(0)
    for vocab in (1, 31, 32, 33, 400, 1000):
        words = rng.integers(-2**31, 2**31 - 1, size=words_for(vocab), dtype=np.int32)
        assert allowed_tokens(torch.from_numpy(words), vocab).tolist() == reference(words, vocab)
        longer = vocab + 40  # logits longer than the bitmask (a padded lm_head)
        assert allowed_tokens(words, longer).tolist() == reference(words, longer)


def test_apply_keeps_allowed_scores_and_forbids_the_rest_in_every_dtype():
    words = np.array([0b1011, 1 << 31], dtype=np.uint32).view(np.int32)
    logits = torch.arange(70, dtype=torch.float32)
    for scores in (logits, logits.to(torch.bfloat16)):
        out = apply_bitmask(scores, torch.from_numpy(words))
        allowed = [i for i in range(70) if torch.isfinite(out[i])]
        assert allowed == [0, 1, 3, 63] and out[3] == scores[3] and out.dtype == scores.dtype
        assert torch.equal(scores, logits.to(scores.dtype))  # the input is not changed
