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


# a compact source and its pretty-printed copy: ' "k1": "v1", "k2": "v2", ...'
JSON_VOCAB = {'Ġ"': 1, 'k1': 2, '":': 3, 'v1': 4, '",': 5, 'k2': 6, 'v2': 7, 'k3': 8, 'v3': 9, '",Ċ': 10,
              'ĠĠ': 11, 'x': 12}
SOURCE = [12, 1, 2, 3, 1, 4, 5, 1, 6, 3, 1, 7, 5, 1, 8, 3, 1, 9, 5]


def test_a_copy_across_a_new_layout_is_drafted_in_the_answers_layout():
    layout = layout_keys(JSON_VOCAB)
    drafter = NgramDrafter(SOURCE, lengths=(3, 2), max_draft=8, layout=layout)
    drafter.extend([11, 1, 2, 3])                        # the answer's first line:   "k1":
    assert drafter.propose() == [1, 4, 5, 1, 6, 3, 1, 7]   # the source's layout, as before
    drafter.extend([1, 4, 10])                           # "v1",\n  : the line end rejected the  ",
    assert drafter.propose() == []                       # the next line's indentation: not known yet
    drafter.extend([11])                                 # the answer indents by '  '
    n, drafts = drafter.match()
    assert n == drafter.continuation                     # the copy goes on where the answer is
    assert drafts == [1, 6, 3, 1, 7, 10, 11, 1]          #  "k2": "v2",\n   "  in the answer's layout
    drafter.extend(drafts + [8])
    assert drafter.propose()[:4] == [3, 1, 9, 10]        #  ": "v3",\n


def test_a_layout_variant_is_taken_back_when_the_answer_writes_the_source_token():
    layout = layout_keys(JSON_VOCAB)
    drafter = NgramDrafter(SOURCE, lengths=(3, 2), max_draft=8, layout=layout)
    drafter.extend([11, 1, 2, 3])
    drafter.propose()
    drafter.extend([1, 4, 10, 11])                       # learns  ", -> ",\n
    assert 10 in drafter.propose()
    drafter.extend([1, 6, 3, 1, 7, 5])                   # ...but this time the answer keeps  ",
    assert 10 not in drafter.propose()


def test_follow_false_is_the_drafter_before_it():
    layout = layout_keys(JSON_VOCAB)
    drafter = NgramDrafter(SOURCE, lengths=(3, 2), max_draft=8, layout=layout, follow=False)
    drafter.extend([11, 1, 2, 3])
    drafter.propose()
    drafter.extend([1, 4, 10, 11])
    assert drafter.propose() == [1, 6, 3, 1, 7, 5, 1, 8]   # the source's tokens as they are
    drafter.extend([1, 6, 3, 1, 7, 10])
    assert drafter.propose() == []                       # no layout match right after a line end


def test_an_exact_copy_is_continued_rather_than_jumping_to_the_latest_occurrence():
    prompt = [20, 21, 1, 2, 3, 4, 30, 31, 1, 2, 3, 5]
    drafter = NgramDrafter(prompt + [20, 21], lengths=(2,), max_draft=2)
    assert drafter.propose() == [1, 2]
    drafter.extend([1, 2, 3])                            # both accepted, then the bonus token
    n, drafts = drafter.match()
    assert (n, drafts) == (drafter.continuation, [4, 30])   # the suffix  2 3  last preceded 5
    drafter.extend([9])                                  # the answer leaves the copy
    assert drafter.match() == (0, [])                    # suffix  3 9  never occurred
    stale = NgramDrafter(prompt + [20, 21], lengths=(2,), max_draft=2, follow=False)
    stale.propose()
    stale.extend([1, 2, 3])
    assert stale.propose() == [5, 20]                     # the most recent  2 3  was followed by 5


# ... "v2"}, in the source; the answer closes the block on a line of its own:  "v2"\n  },\n
SPLIT_VOCAB = {**JSON_VOCAB, '"},': 22, '"Ċ': 23, 'Ġ},Ċ': 24, 'k4': 25, '"': 26}
SPLIT_SOURCE = [12, 1, 2, 3, 1, 4, 5, 1, 6, 3, 1, 7, 22, 1, 8, 3, 1, 9, 22, 1, 25, 3]


def test_a_source_token_broken_over_a_line_end_is_followed_and_then_drafted_broken():
    layout = layout_keys(SPLIT_VOCAB)
    drafter = NgramDrafter(SPLIT_SOURCE, lengths=(3, 2), max_draft=8, layout=layout)
    drafter.extend([11, 1, 2, 3])
    drafter.propose()
    drafter.extend([1, 4, 10, 11])                       # learns  ", -> ",\n  and the indentation
    assert drafter.propose() == [1, 6, 3, 1, 7, 22, 1, 8]
    drafter.extend([1, 6, 3, 1, 7, 23])                  # the answer breaks  "},  after its  "
    assert drafter.propose() == []                       # (how it writes the rest: not known yet)
    drafter.extend([11, 24])                             # ...  },\n : the copy was followed through it
    n, drafts = drafter.match()
    assert n == drafter.continuation
    assert drafts == [11, 1, 8, 3, 1, 9, 23]             # the next  "},  drafted as the answer wrote it
    # (then a closing line, whose indentation is the opener's line's: none opened here, so it stops)

