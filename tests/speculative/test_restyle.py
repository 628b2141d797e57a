"""Restyle's indentation after a line that opens a block (no model)."""
from engine.speculative.layout import layout_keys
from engine.speculative.restyle import Restyle

# 'a:' opens a block, its body is indented by two spaces; 'Ċ' is a bare newline
VOCAB = {'a': 1, ':Ċ': 2, 'ĠĠ': 3, 'b': 5, 'Ċ': 6}


def test_a_second_sibling_block_is_indented_deeper_too():
    """Code's blocks never close on a line of their own, so the first block stays counted as
    open; the second opener at the same indentation still takes the deeper indentation."""
    restyle = Restyle(layout_keys(VOCAB))
    answer = [6, 1, 2, 3, 5, 6, 1, 2]          # \n a:\n   b\n a:\n
    for previous, token in zip(answer, answer[1:]):
        restyle.observe(previous, token)
    source = [1, 2, 3, 5, 6]
    copy = restyle.draft(answer + source, len(answer) + 2, want=3, after_line_end=True)
    assert copy.drafts == [3, 5, 6]             # the learned deeper indentation (the source's own
                                                # indentation replaced by it), then the copy
