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


def test_an_agents_engine_calls_carry_its_class():
    """Each model call of an agent run (and of the CLI evaluation, class ``batch``) reaches
    the engine with the job's class, which its scheduler admits and preempts by."""
    from agent.model import EngineChatModel
    from engine.types import GenerationResult, Timings, Usage

    seen = []

    class Recorder:
        def generate(self, request, on_text=None, should_cancel=None):
            seen.append(request.priority)
            return GenerationResult("4", "stop", Usage(), Timings(), "paged")

    EngineChatModel(Recorder(), method="paged", priority=rank("batch")).chat(
        [{"role": "user", "content": "2+2?"}], None, 8)
    assert seen == [rank("batch")]
