"""The agent's tool-call turns carry the lazy tool-call grammar (and can run without it)."""
from __future__ import annotations

from agent.model import EngineChatModel
from engine.types import GenerationResult, Timings, Usage
from tools import create_default_registry


class Recorder:
    def __init__(self) -> None:
        self.requests = []

    def generate(self, request, on_text=None, should_cancel=None) -> GenerationResult:
        self.requests.append(request)
        return GenerationResult("ok", "stop", Usage(), Timings(), request.method)


def test_tool_turns_are_constrained_to_one_call_of_a_declared_tool():
    tools = create_default_registry().openai_schemas()
    recorder = Recorder()
    EngineChatModel(recorder).chat([{"role": "user", "content": "2+2"}], tools, 32)
    constraint = recorder.requests[0].constraint
    assert constraint.kind == "tools" and constraint.lazy
    assert constraint.trigger_regex and not constraint.start_triggers  # the name rule, as on /v1
    for tool in tools:
        assert f'"{tool["function"]["name"]}' in constraint.grammar
        assert tool["function"]["name"] in constraint.trigger_regex
    assert '"\\n" call' not in constraint.grammar  # one call per turn


def test_answer_turns_and_the_unconstrained_model_carry_no_grammar():
    tools = create_default_registry().openai_schemas()
    recorder = Recorder()
    EngineChatModel(recorder).chat([{"role": "user", "content": "hi"}], None, 32)
    EngineChatModel(recorder, constrained=False).chat([{"role": "user", "content": "2+2"}], tools, 32)
    assert [r.constraint for r in recorder.requests] == [None, None]
