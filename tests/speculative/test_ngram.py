"""The n-gram drafter and the adaptive policy."""
from __future__ import annotations

import pytest

from engine.speculative.layout import layout_keys
from engine.speculative.ngram import NgramDrafter
from engine.speculative.policy import Proposal, SpecConfig, SpecState


def test_longest_suffix_match_proposes_what_followed_it():
    d = NgramDrafter([1, 2, 3, 4, 5, 9, 9, 2, 3], lengths=(3, 2, 1), max_draft=3)
    assert d.propose() == [4, 5, 9]          # "2 3" occurred at 1..2, followed by 4 5 9
    d.append(4)
    assert d.propose() == [5, 9, 9]          # the 3-gram "2 3 4" now matches
    assert d.propose(limit=1) == [5]


def test_longer_match_wins_over_a_more_recent_shorter_one():
    d = NgramDrafter([7, 8, 1, 5, 6, 1, 2, 7, 8], lengths=(2, 1), max_draft=2)
    assert d.propose() == [1, 5]             # "7 8" -> 1 5 (the 1-gram "8" agrees here)
    d = NgramDrafter([5, 1, 2, 3, 9, 2, 3, 4, 1, 2], lengths=(2, 1), max_draft=2)
    assert d.propose() == [3, 9]             # "1 2" at 1..2 beats the newer "2" at 5


def test_most_recent_occurrence_and_never_itself():
    d = NgramDrafter([1, 2, 5, 1, 2, 6, 1, 2], lengths=(2,), max_draft=2)
    assert d.propose() == [6, 1]
    assert NgramDrafter([1, 2, 3], lengths=(2,), max_draft=4).propose() == []
    # a run of one token: the continuation stops at the sequence's end
    assert NgramDrafter([4, 4, 4], lengths=(2,), max_draft=4).propose() == [4]


def test_sync_catches_up_and_index_stays_small():
    tokens = list(range(50)) * 3
    d = NgramDrafter(tokens[:10], lengths=(3, 2), max_draft=4)
    d.sync(tokens)
    assert len(d) == len(tokens)
    assert d.propose() == [0, 1, 2, 3]      # "48 49" -> the wrap-around continuation
    assert len(d._index) <= 2 * 50 + 2      # one entry per distinct n-gram, not per position


@pytest.mark.parametrize("bad", [dict(lengths=()), dict(lengths=(0,)), dict(max_draft=0)])
def test_bad_arguments(bad):
    kwargs = dict(lengths=(2,), max_draft=2) | bad
    with pytest.raises(ValueError):
        NgramDrafter([1, 2], **kwargs)


def test_match_reports_the_length_that_matched():
    d = NgramDrafter([5, 1, 2, 3, 9, 2, 3, 4, 1, 2], lengths=(2, 1), max_draft=2)
    assert d.match() == (2, [3, 9])
    assert NgramDrafter([1, 2, 3], lengths=(2,), max_draft=4).match() == (0, [])


def test_chances_fall_with_rejections_and_rise_with_acceptances():
    state = SpecState.start(SpecConfig(num_tokens=4, ngram_lengths=(1,), prior=0.5), [3, 4, 3, 4, 3])
    proposal = state.propose(4)
    assert proposal.ngram == 1 and proposal.tokens == [4, 3]
    assert proposal.chances == pytest.approx([0.5, 0.25])
    assert state.begin(proposal, 1) == [4]
    state.record(1, 0)                          # rejected: the estimate drops
    assert state.rate(1) == pytest.approx(0.4)
    for _ in range(20):
        state.begin(state.propose(4), 2)
        state.record(2, 2)                      # all accepted: it climbs toward 1
    assert state.rate(1) > 0.99 and state.rate(3) == 0.5   # other lengths keep their own
    assert state.acceptance == pytest.approx(40 / 41)
    assert state.propose(0).tokens == []


def test_a_skipped_match_drifts_back_toward_the_prior():
    state = SpecState.start(SpecConfig(ngram_lengths=(1,), prior=0.6, recover=0.5), [3, 3, 3])
    state.rates[1] = 0.2
    assert state.begin(state.propose(4), 0) == []
    assert state.rate(1) == pytest.approx(0.4)
    assert state.begin(Proposal(), 0) == [] and state.rate(1) == pytest.approx(0.4)   # no match: unchanged


# a byte-level vocabulary: 'Ġ' is a space, 'Ċ' a newline
VOCAB = {'"a': 10, '",': 11, 'Ġ"': 12, 'b': 13, '":': 14, '",Ċ': 15, 'ĠĠĠĠ': 16, 'c': 17, 'd': 18}


def test_layout_keys_from_a_byte_level_vocabulary():
    layout = layout_keys(VOCAB)
    assert layout.keys == {15: 11, 16: None}          # '",\n' read as '",'; indentation skipped
    assert layout.ends_line == {15}


def test_layout_matching_follows_content_across_a_new_layout():
    layout = layout_keys(VOCAB)
    prompt = [10, 11, 12, 13, 14, 17, 18, 11, 12, 10]
    answer = [10, 15, 16, 12]                   # "a",\n    "  ~ the prompt's  "a", "  then  b
    exact = NgramDrafter(prompt + answer, lengths=(3, 2), max_draft=8)
    keyed = NgramDrafter(prompt + answer, lengths=(3, 2), max_draft=8, layout=layout)
    assert exact.propose() == []                # token for token the thread is lost
    assert keyed.match() == (3, [13, 14, 17, 18, 11, 12, 10, 10])   # keys  "a  ",  "  found in the prompt
    # right after a line end the layout index does not draft (indentation unknown)
    assert NgramDrafter(prompt + [10, 15], lengths=(2,), max_draft=8, layout=layout).propose() == []
    # where the exact match is as long, it wins (copying the layout as it is)
    same = NgramDrafter([1, 2, 3, 16, 4, 1, 2, 3], lengths=(3,), max_draft=2, layout=layout)
    assert same.propose() == [16, 4]
