"""The n-gram drafter and the adaptive policy."""
from __future__ import annotations

import pytest

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


def test_an_exact_copy_is_continued_rather_than_jumping_to_the_latest_occurrence():
    prompt = [20, 21, 1, 2, 3, 4, 30, 31, 1, 2, 3, 5]
    drafter = NgramDrafter(prompt + [20, 21], lengths=(2,), max_draft=2)
    assert drafter.propose() == [1, 2]
    drafter.extend([1, 2, 3])                            # both accepted, then the bonus token
    n, drafts = drafter.match()
    assert (n, drafts) == (drafter.continuation, [4, 30])   # the suffix  2 3  last preceded 5
    drafter.extend([4, 30, 9])                           # both accepted, then the answer leaves the copy
    assert drafter.match() == (0, [])                    # suffix  30 9  never occurred
    fresh = NgramDrafter(prompt + [20, 21, 1, 2, 3], lengths=(2,), max_draft=2)
    assert fresh.propose() == [5, 20]                    # no copy followed: the most recent  2 3


def test_a_copy_is_not_followed_past_where_the_answer_began():
    drafter = NgramDrafter([1, 2, 3, 1, 2], lengths=(2,), max_draft=4)
    assert drafter.propose() == [3, 1, 2]
    drafter.extend([3, 1, 2])                            # the copy reached the answer's own tokens
    assert drafter.match() == (2, [3, 1, 2])             # a fresh lookup, not a continuation
