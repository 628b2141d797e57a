"""Priority classes (core/priorities.py): their order, a key's cap, and the class a stored
job hands the engine (``GenerationRequest.priority``, the paged scheduler's ``Sequence.priority``)."""
import pytest

from core.priorities import PRIORITY_CLASSES, capped, rank
from core.settings import load_settings
from worker.requests import generation_request_from


def test_classes_rank_most_urgent_first_and_unknown_is_default():
    assert [rank(c) for c in PRIORITY_CLASSES] == [0, 1, 2]
    assert rank(None) == rank("something else") == rank("default")


@pytest.mark.parametrize("asked,cap,runs", [("interactive", None, "interactive"), ("interactive", "default", "default"),
                                            ("batch", "default", "batch"), ("default", "batch", "batch")])
def test_a_cap_only_lowers(asked, cap, runs):
    assert capped(asked, cap) == runs


def test_the_stored_class_reaches_the_engine_request():
    stored = {"messages": [{"role": "user", "content": "hi"}], "sampling": {"max_new_tokens": 4}}
    assert generation_request_from({**stored, "priority": "batch"}, 16).priority == 2
    assert generation_request_from({**stored, "priority": "interactive"}, 16).priority == 0
    assert generation_request_from(stored, 16).priority == 1  # stored before classes existed


def test_a_cap_that_is_not_a_class_is_refused_at_start():
    with pytest.raises(ValueError, match="MINISERVE_KEY_PRIORITY_CAPS"):
        load_settings(key_priority_caps="k1=urgent")
    assert load_settings(key_priority_caps="k1=batch, k2=default").key_priority_caps == {"k1": "batch", "k2": "default"}
