"""Incremental detokenizing gives whole characters; stop strings cut the text exactly."""
from __future__ import annotations

import pytest
from transformers import AutoTokenizer

from engine.textstream import IncrementalDetokenizer, StopMatcher, TextStream

TEXTS = ["你好，世界！今天天气很好。", "Emoji 😀🚀✨ and café naïve", "北京 is 中国的首都 😀 ok", "plain ascii text"]


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    return AutoTokenizer.from_pretrained(tiny_model_dir)


@pytest.mark.parametrize("text", TEXTS)
def test_pieces_are_whole_characters_and_add_up(tokenizer, text):
    ids = tokenizer.encode(text, add_special_tokens=False)
    assert len(ids) > 3
    # The tiny BPE really splits multi-byte characters: single-token decodes are broken.
    if any(ord(ch) > 127 for ch in text):
        assert any("\ufffd" in tokenizer.decode([i]) for i in ids)
    detok = IncrementalDetokenizer(tokenizer)
    pieces = [detok.push(i) for i in ids] + [detok.flush()]
    assert all("\ufffd" not in p for p in pieces)
    assert "".join(pieces) == text == tokenizer.decode(ids)


def test_textstream_without_stops_matches_decode(tokenizer):
    text = TEXTS[0] + TEXTS[1]
    ids = tokenizer.encode(text, add_special_tokens=False)
    stream = TextStream(tokenizer)
    out = "".join(stream.push(i)[0] for i in ids) + stream.finish()
    assert out == stream.text == text


@pytest.mark.parametrize("stop,expected", [
    ("天气", "你好，世界！今天"), ("！", "你好，世界"), ("界！今", "你好，世"), ("never", "你好，世界！今天天气很好。"),
])
def test_stop_strings_cut_exactly_and_never_stream_part_of_a_stop(tokenizer, stop, expected):
    text = "你好，世界！今天天气很好。"
    ids = tokenizer.encode(text, add_special_tokens=False)
    stream = TextStream(tokenizer, [stop])
    emitted, hit = [], False
    for i in ids:
        piece, hit = stream.push(i)
        emitted.append(piece)
        if hit:
            break
    emitted.append(stream.finish())
    assert "".join(emitted) == stream.text == expected
    assert hit == (stop in text)


def test_earliest_of_several_stops_wins(tokenizer):
    text = "The quick brown fox jumps over the lazy dog."
    stream = TextStream(tokenizer, ["lazy", "brown", "fox"])
    for i in tokenizer.encode(text, add_special_tokens=False):
        if stream.push(i)[1]:
            break
    assert stream.text == "The quick " and stream.stop_string == "brown"


def test_the_stop_string_that_hit_is_named(tokenizer):
    text = "one two three four"
    stream = TextStream(tokenizer, ["four", "two", "tw"])
    for i in tokenizer.encode(text, add_special_tokens=False):
        if stream.push(i)[1]:
            break
    assert stream.text == "one " and stream.stop_string in ("two", "tw")
    assert StopMatcher(["four", "two", "tw"]).which(text, 4) == "two"   # several start there: the first listed
    plain = TextStream(tokenizer, ["never"])
    for i in tokenizer.encode(text, add_special_tokens=False):
        plain.push(i)
    plain.finish()
    assert plain.stop_string is None


def test_stop_matcher_holds_back_only_possible_prefixes():
    matcher = StopMatcher(["</end>", "STOP"])
    assert matcher.safe_length("hello </e") == len("hello ")
    assert matcher.safe_length("hello ST") == len("hello ")
    assert matcher.safe_length("hello world") == len("hello world")
    assert matcher.find("abc STOP def", 0) == 4
    assert matcher.find("abc", 0) == -1


@pytest.mark.parametrize("text", TEXTS)
@pytest.mark.parametrize("stops", [(), ("天气",), ("ve",)])
def test_covered_counts_the_tokens_whose_text_is_out(tokenizer, text, stops):
    """After each push, the covered tokens decode to exactly the text handed out so far (a
    token holding half a character waits for the token that completes it); with stop
    strings, to a prefix of it (a token may be partly out, partly held back)."""
    ids = tokenizer.encode(text, add_special_tokens=False)
    stream = TextStream(tokenizer, stops)
    out = ""
    for i in ids:
        piece, hit = stream.push(i)
        out += piece
        if not hit:
            covered = tokenizer.decode(ids[:stream.covered])
            assert covered == out if not stops else out.startswith(covered)
    out += stream.finish()
    assert stream.covered == len(ids) and out == stream.text
