"""A request resumed after n streamed tokens (``GenerationRequest.resume``, what a later
attempt of a job does after its worker died) streams exactly the rest of the answer, and
its result is the whole answer: greedy, and seeded sampling (seeded per position)."""
from __future__ import annotations

import pytest

from engine.types import GenerationRequest, Resume, SamplingParams

USER = [{"role": "user", "content": "你好 world, count to twenty please"}]


def _request(method: str, **sampling) -> GenerationRequest:
    sampling = {"max_new_tokens": 40, "ignore_eos": True, **sampling}
    return GenerationRequest(messages=USER, method=method, sampling=SamplingParams(**sampling))


def _streamed(engine, request):
    """The result, and after each piece: (text so far, tokens covered so far)."""
    handle = engine.loop.submit(request)
    marks, text = [], []

    def on_text(piece: str) -> None:
        text.append(piece)
        marks.append(("".join(text), handle.tokens_covered))

    return handle.stream(on_text), marks


@pytest.mark.parametrize("method", ["paged", "custom_cache"])
@pytest.mark.parametrize("sampling", [{}, {"temperature": 0.9, "seed": 7}], ids=["greedy", "seeded"])
def test_a_resumed_request_streams_the_rest_and_returns_the_whole_answer(tiny_engine, method, sampling):
    full, marks = _streamed(tiny_engine, _request(method, **sampling))
    assert len(full.token_ids) == 40 and len(marks) >= 4
    for text_so_far, covered in (marks[0], marks[len(marks) // 2], marks[-2]):
        resume = Resume(ids=tuple(full.token_ids[:covered]), text_chars=len(text_so_far))
        rest, _ = _streamed(tiny_engine, GenerationRequest(**{**_request(method, **sampling).__dict__,
                                                              "resume": resume}))
        assert rest.token_ids == full.token_ids, (method, covered)
        assert rest.text == full.text and rest.usage.completion_tokens == full.usage.completion_tokens
        assert rest.usage.prompt_tokens == full.usage.prompt_tokens
        streamed = _streamed_text(tiny_engine, method, sampling, resume)
        assert text_so_far + streamed == full.text  # nothing repeated, nothing lost


def _streamed_text(engine, method, sampling, resume) -> str:
    request = GenerationRequest(**{**_request(method, **sampling).__dict__, "resume": resume})
    pieces: list[str] = []
    engine.loop.submit(request).stream(pieces.append)
    return "".join(pieces)


def test_a_resumed_request_brings_the_earlier_logprobs_first(tiny_engine):
    full, marks = _streamed(tiny_engine, _request("paged", logprobs=True, top_logprobs=2))
    text_so_far, covered = marks[len(marks) // 2]
    resume = Resume(ids=tuple(full.token_ids[:covered]), text_chars=len(text_so_far),
                    logprobs=tuple(full.logprobs[:covered]))
    rest = tiny_engine.generate(GenerationRequest(**{**_request("paged", logprobs=True, top_logprobs=2).__dict__,
                                                     "resume": resume}))
    assert [e["token_id"] for e in rest.logprobs] == [e["token_id"] for e in full.logprobs]
    assert rest.logprobs[:covered] == full.logprobs[:covered]


def test_an_answer_that_had_reached_its_max_tokens_ends_at_once(tiny_engine):
    full, marks = _streamed(tiny_engine, _request("paged", max_new_tokens=12))
    resume = Resume(ids=tuple(full.token_ids), text_chars=len(full.text))
    pieces: list[str] = []
    rest = tiny_engine.loop.submit(GenerationRequest(**{**_request("paged", max_new_tokens=12).__dict__,
                                                        "resume": resume})).stream(pieces.append)
    assert pieces == [] and rest.text == full.text and rest.finish_reason == "length"
    assert rest.usage.completion_tokens == 12
