"""The acceptance rule: greedy picks exactly the argmax chain; sampling keeps the
distribution (chi-square against plain sampling from the same processed scores)."""
from __future__ import annotations

from collections import Counter

import torch

from engine.sampling import Sampler
from engine.speculative.acceptance import accept_drafts
from engine.types import SamplingParams
from tests.speculative.stats import chi_square_p

VOCAB = 12


def _logits(seed: int, rows: int) -> torch.Tensor:
    return torch.randn(rows, VOCAB, generator=torch.Generator().manual_seed(seed)) * 1.5


def test_greedy_accepts_the_agreeing_run_then_corrects():
    logits = _logits(0, 4)
    sampler = Sampler(SamplingParams(), 1.3, VOCAB, [0, 1])
    reference = Sampler(SamplingParams(), 1.3, VOCAB, [0, 1])
    chain = [reference(row) for row in logits]            # what plain greedy picks row by row
    wrong = (chain[2] + 1) % VOCAB
    out = accept_drafts(sampler, logits, [chain[0], chain[1], wrong])
    assert out == chain[:3]                                # two accepted, then the correction
    assert torch.equal(sampler.seen, _seen([0, 1, *chain[:3]], sampler.seen))  # emitted = observed
    all_ok = accept_drafts(Sampler(SamplingParams(), 1.3, VOCAB, [0, 1]), logits, chain[:3])
    assert all_ok == chain                                 # all accepted + the bonus token


def _seen(tokens, like):
    mask = torch.zeros_like(like)
    mask[list(tokens)] = True
    return mask


def test_penalty_sees_accepted_drafts_before_scoring_the_next_row():
    """Row 1 is scored after draft 0 is observed: with a strong penalty, repeating
    draft 0 must lose even though row 1's raw argmax is that token."""
    logits = torch.full((2, VOCAB), -1.0)
    logits[0, 5] = 3.0
    logits[1, 5], logits[1, 6] = 2.0, 1.5
    sampler = Sampler(SamplingParams(), 2.0, VOCAB, [])
    assert accept_drafts(sampler, logits, [5]) == [5, 6]


def test_sampled_first_token_keeps_its_distribution():
    params = SamplingParams(temperature=0.9, top_k=8, top_p=0.95)
    logits = _logits(1, 2)
    runs = 6000
    plain = Sampler(params, 1.2, VOCAB, [3])
    plain.generator.manual_seed(123)
    ref = Counter()
    for _ in range(runs):
        plain.seen[:] = False
        plain.seen[3] = True
        ref[plain(logits[0])] += 1
    spec_first, spec_second = Counter(), Counter()
    sampler = Sampler(params, 1.2, VOCAB, [3])
    sampler.generator.manual_seed(456)
    likely = int(torch.argmax(logits[0]))
    for _ in range(runs):
        sampler.seen[:] = False
        sampler.seen[3] = True
        out = accept_drafts(sampler, logits, [likely])
        spec_first[out[0]] += 1
    assert spec_first[likely] < runs                      # rejections happen
    assert chi_square_p(ref, spec_first) > 1e-3
    # and a draft of an unlikely token is still drawn at its own (small) rate
    unlikely = int(torch.argmin(logits[0]))
    for _ in range(runs):
        sampler.seen[:] = False
        sampler.seen[3] = True
        spec_second[accept_drafts(sampler, logits, [unlikely])[0]] += 1
    assert chi_square_p(ref, spec_second) > 1e-3


def test_wrong_row_count_is_refused():
    import pytest

    with pytest.raises(ValueError):
        accept_drafts(Sampler(SamplingParams(), 1.0, VOCAB, []), _logits(0, 2), [1, 2])
