"""Constrained decoding in the engine, on the tiny random model: a grammar makes even random
weights write valid JSON, in every method and per sequence inside a batch."""
from __future__ import annotations

import json
import jsonschema
import pytest
import torch

from core.tool_calls import parse_tool_calls
from core import grammar
from core.grammar import ToolSpec
from engine.constrained import GrammarError, compiler_for, token_constraint
from engine.types import GenerationRequest, SamplingParams

SHORT = {"type": "string", "maxLength": 12}
ORDER = {"type": "object", "properties": {
    "customer": {"type": "object", "properties": {"name": SHORT, "vip": {"type": "boolean"}},
                 "required": ["name", "vip"], "additionalProperties": False},
    "items": {"type": "array", "minItems": 1, "maxItems": 3, "items": {
        "type": "object", "properties": {"sku": SHORT, "quantity": {"type": "integer", "minimum": 1, "maximum": 99}},
        "required": ["sku", "quantity"], "additionalProperties": False}},
    "priority": {"enum": ["low", "normal", "high"]}},
    "required": ["customer", "items", "priority"], "additionalProperties": False}
WEATHER = {"type": "object", "properties": {"city": SHORT, "unit": {"enum": ["celsius", "fahrenheit"]}},
           "required": ["city", "unit"], "additionalProperties": False}
CALC = {"type": "object", "properties": {"expression": SHORT}, "required": ["expression"], "additionalProperties": False}
METHODS = ["official", "no_cache", "custom_cache", "prefix_cache", "paged"]


def request(constraint=None, method="custom_cache", seed=1, tokens=200, text="Order something.") -> GenerationRequest:
    return GenerationRequest(messages=[{"role": "user", "content": text}], method=method, constraint=constraint,
                             sampling=SamplingParams(max_new_tokens=tokens, temperature=1.0, seed=seed))


@pytest.mark.parametrize("method", METHODS)
def test_every_method_writes_json_that_validates(tiny_engine, method):
    result = tiny_engine.generate(request(grammar.json_schema(ORDER), method=method, tokens=400))
    assert result.finish_reason == "stop"
    jsonschema.validate(json.loads(result.text), ORDER)


def test_the_same_seed_gives_the_same_constrained_answer_in_every_method(tiny_engine):
    texts = {m: tiny_engine.generate(request(grammar.json_schema(WEATHER), method=m, seed=7)).text
             for m in ("official", "custom_cache", "paged")}
    assert len(set(texts.values())) == 1, texts


def test_without_a_constraint_random_weights_write_no_json(tiny_engine):
    """The guard that makes the other tests mean something."""
    text = tiny_engine.generate(request(None, seed=1, tokens=40)).text
    with pytest.raises(ValueError):
        json.loads(text)


def test_choice_and_regex(tiny_engine):
    options = ["yes", "no", "maybe later"]
    for seed in range(4):
        assert tiny_engine.generate(request(grammar.choice(options), seed=seed)).text in options
        text = tiny_engine.generate(request(grammar.regex(r"[A-Z]{2}-[0-9]{3}"), seed=seed)).text
        assert len(text) == 6 and text[:2].isupper() and text[2] == "-" and text[3:].isdigit()


def test_required_tool_calls_name_a_declared_function_with_valid_arguments(tiny_engine):
    tools = [ToolSpec("get_weather", WEATHER), ToolSpec("calculator", CALC)]
    for parallel in (False, True):
        for seed in range(3):
            result = tiny_engine.generate(request(grammar.tool_calls(tools, parallel=parallel), seed=seed))
            parsed = parse_tool_calls(result.text, known_tools=["get_weather", "calculator"])
            assert result.finish_reason == "stop" and parsed.calls and not parsed.content
            assert parallel or len(parsed.calls) == 1
            for call in parsed.calls:
                jsonschema.validate(call.arguments, WEATHER if call.name == "get_weather" else CALC)


def test_constrained_and_free_sequences_share_a_batch(tiny_engine):
    """Each row gets its own mask: the free sequences answer exactly as when run alone."""
    import threading

    free = [GenerationRequest(messages=[{"role": "user", "content": f"Say {i}"}], method="paged",
                              sampling=SamplingParams(max_new_tokens=16)) for i in range(3)]
    alone = [tiny_engine.generate(r).text for r in free]
    loop, gate = tiny_engine.loop, threading.Event()
    loop.post(gate.wait)  # hold the loop: every request below joins the same first step
    constrained = [loop.submit(request(grammar.json_schema(ORDER), method="paged", seed=s, tokens=400))
                   for s in range(3)]
    mixed = [loop.submit(r) for r in free]
    gate.set()
    assert [h.result(300).text for h in mixed] == alone
    for handle in constrained:
        jsonschema.validate(json.loads(handle.result(300).text), ORDER)
    assert loop.call(lambda: loop.paged.stats.max_batch_size) >= 6


def test_compiled_grammars_are_cached_by_hash(tiny_engine):
    compiler = compiler_for(tiny_engine)
    constraint = grammar.json_schema({"type": "object", "properties": {"cache_probe": {"type": "integer"}}})
    before = compiler.stats()
    first = compiler.compile(constraint)
    again = compiler.compile(grammar.json_schema({"type": "object", "properties": {"cache_probe": {"type": "integer"}}}))
    after = compiler.stats()
    assert again is first
    assert (after["misses"] - before["misses"], after["hits"] - before["hits"]) == (1, 1)


@pytest.mark.parametrize("method", METHODS)
def test_a_request_compiles_its_grammar_once_whatever_the_method(tiny_engine, method):
    """The loop compiles at submit (errors reach the caller); the method samples with that
    constraint instead of looking the grammar up again."""
    compiler = compiler_for(tiny_engine)
    schema = {"type": "object", "properties": {f"once_{method}": {"type": "integer"}}}  # new to the cache
    before = compiler.stats()
    result = tiny_engine.generate(request(grammar.json_schema(schema), method=method, tokens=40))
    after = compiler.stats()
    assert (after["misses"] - before["misses"], after["hits"] - before["hits"]) == (1, 0)
    assert result.text


def test_a_grammar_that_does_not_compile_raises_grammar_error(tiny_engine):
    with pytest.raises(GrammarError, match="regex"):
        token_constraint(tiny_engine, grammar.regex("(unclosed"))
    with pytest.raises(GrammarError):
        tiny_engine.generate(request(grammar.json_schema({"$ref": "#/nowhere"})))


def _feed(constraint, tokenizer, text: str) -> None:
    for token in tokenizer.encode(text, add_special_tokens=False):
        constraint.accept(token)


@pytest.mark.parametrize("before,call_start", [
    ("Let me check that. ", "<tool_call>\n"), ("Sure:\n", "```json\n"), ("  ", "")])
def test_a_lazy_constraint_waits_for_a_call_to_start(tiny_engine, before, call_start):
    tokenizer = tiny_engine.loaded.tokenizer
    lazy = grammar.tool_calls([ToolSpec("get_weather", WEATHER)], parallel=False, lazy=True)
    constraint = token_constraint(tiny_engine, lazy)
    logits = torch.zeros(tiny_engine.loaded.model.config.vocab_size)
    _feed(constraint, tokenizer, before)
    assert not constraint.active and constraint.mask(logits) is logits
    _feed(constraint, tokenizer, call_start + '{"name": "get_weather", "arguments": {"city": "Pa')
    assert constraint.active
    allowed = torch.isfinite(constraint.mask(logits))
    assert 0 < int(allowed.sum()) < logits.numel()
    for token in range(logits.numel()):  # nothing the mask allows breaks the call
        if allowed[token]:
            assert '"name"' not in tokenizer.decode([token])


def test_a_lazy_constraint_ignores_braces_after_the_answer_started(tiny_engine):
    tokenizer = tiny_engine.loaded.tokenizer
    constraint = token_constraint(tiny_engine, grammar.tool_calls([ToolSpec("get_weather", WEATHER)], lazy=True))
    _feed(constraint, tokenizer, "The set {1, 2} has two items.")
    assert not constraint.active


def test_lazy_auto_answers_in_text_or_a_valid_call(tiny_engine):
    lazy = grammar.tool_calls([ToolSpec("get_weather", WEATHER), ToolSpec("calculator", CALC)], lazy=True)
    for seed in range(6):
        result = tiny_engine.generate(request(lazy, seed=seed, tokens=120))
        parsed = parse_tool_calls(result.text, known_tools=["get_weather", "calculator"])
        for call in parsed.calls:
            jsonschema.validate(call.arguments, WEATHER if call.name == "get_weather" else CALC)


@pytest.mark.parametrize("method", ["custom_cache", "paged"])
def test_a_constrained_request_does_not_draft(tiny_engine, method):
    """Speculative drafts are not checked against the grammar, so a constrained request asking
    for them decodes one token at a time (and stays valid)."""
    from dataclasses import replace

    result = tiny_engine.generate(replace(request(grammar.json_schema(ORDER), method=method, tokens=400),
                                          speculative=True))
    jsonschema.validate(json.loads(result.text), ORDER)
    assert result.usage.draft_tokens == 0
