"""EngineChatModel over a fake TextGenerator that streams scripted chunks."""
import pytest

from agent.model import EngineChatModel, GenerationCancelled
from engine.types import GenerationResult, Timings, Usage


class StreamingGenerator:
    def __init__(self, chunks):
        self.chunks = chunks
        self.requests = []

    def generate(self, request, on_text=None, should_cancel=None):
        self.requests.append(request)
        emitted = []
        for chunk in self.chunks:
            if should_cancel and should_cancel():
                break
            emitted.append(chunk)
            if on_text:
                on_text(chunk)
        finish = "cancelled" if len(emitted) < len(self.chunks) else "stop"
        return GenerationResult("".join(emitted), finish, Usage(10, len(emitted)), Timings(), request.method)


TOOLS = [{"type": "function", "function": {"name": "calculator", "parameters": {}}}]
CALL = ['{"name": "calcul', 'ator", "arguments": {"expression": "1+2"}', '}', '\n']


def test_stops_once_a_call_is_followed_by_other_text():
    gen = StreamingGenerator(CALL + ['{"response', '": "3"}', '\n', "more"])
    text = EngineChatModel(gen).chat([{"role": "user", "content": "1+2"}], TOOLS, 64)
    assert text == "".join(CALL) + '{"response'
    request = gen.requests[0]
    assert request.sampling.temperature == 0 and request.sampling.max_new_tokens == 64 and request.tools == TOOLS


def test_keeps_going_for_a_second_call():
    second = ['{"name": "calculator", ', '"arguments": {"expression": "3*4"}}', "\n", "Done", "!"]
    text = EngineChatModel(StreamingGenerator(CALL + second)).chat([], TOOLS, 64)
    assert text.endswith('"3*4"}}\nDone')


def test_no_early_stop_without_tools():
    chunks = CALL + ["The answer", " is 3."]
    assert EngineChatModel(StreamingGenerator(chunks)).chat([], None, 64) == "".join(chunks)


def test_caller_cancel_raises():
    model = EngineChatModel(StreamingGenerator(["a", "b"]), should_cancel=lambda: True)
    with pytest.raises(GenerationCancelled):
        model.chat([], None, 8)
