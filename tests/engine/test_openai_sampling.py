"""OpenAI's presence/frequency penalties, ``logit_bias`` and log-probabilities in every
method, on the tiny model in fp32, against a transformers forward of the same sequence."""
from __future__ import annotations

import json
import threading

import jsonschema
import pytest
import torch
from transformers import RepetitionPenaltyLogitsProcessor

from core import grammar
from engine.penalties import penalize_counts
from engine.sampling import Sampler
from engine.types import GenerationRequest, SamplingParams

METHODS = ["official", "no_cache", "custom_cache", "prefix_cache", "paged"]
USER = [{"role": "user", "content": "你好 world, compute 12 * 3 please"}]
COPY = [{"role": "user", "content": "Rename foo to bar: def foo(x): return foo(x - 1) + foo(x - 2)\n"
                                    "def foo(x): return foo(x - 1) + foo(x - 2)"}]


def _req(method, messages=USER, constraint=None, speculative=None, **sampling):
    sampling.setdefault("max_new_tokens", 12)
    return GenerationRequest(messages=messages, method=method, constraint=constraint, speculative=speculative,
                             sampling=SamplingParams(**sampling))


def reference_scores(logits, prompt, generated, penalty, presence, frequency, bias):
    """A hand-written OpenAI transform of one row, after transformers' repetition penalty."""
    ids = torch.tensor([prompt + generated])
    scores = RepetitionPenaltyLogitsProcessor(penalty)(ids, logits[None].clone())[0] if penalty != 1.0 else logits.clone()
    for token in set(generated):
        scores[token] -= presence + frequency * generated.count(token)
    for token, value in bias:
        scores[token] += value
    return scores


def test_penalties_transform_matches_the_hand_written_definition():
    torch.manual_seed(0)
    vocab = 50
    logits = torch.randn(vocab)
    prompt, generated = [1, 2, 3], [4, 4, 4, 7, 2]
    bias = ((9, -100.0), (10, 5.5))
    params = SamplingParams(presence_penalty=0.7, frequency_penalty=-0.3, logit_bias=bias)
    sampler = Sampler(params, 1.2, vocab, prompt)
    for token in generated:
        sampler.observe(token)
    got = sampler.process(logits)
    want = reference_scores(logits, prompt, generated, 1.2, 0.7, -0.3, bias)
    assert torch.allclose(got, want, atol=1e-6)
    row = penalize_counts(torch.zeros(vocab), torch.tensor([4]), torch.tensor([3.0]), 0.5, 0.25)
    assert row[4] == pytest.approx(-1.25) and row[5] == 0.0


def _forward_logprobs(engine, request, token_ids, penalty):
    """log_softmax of transformers' forward at every generated position, after the processors."""
    model = engine.loaded.model
    prompt = engine.prompt(request).ids
    s = request.sampling
    with torch.no_grad():
        logits = model(torch.tensor([prompt + token_ids])).logits[0].float()
    rows = []
    for i in range(len(token_ids)):
        scores = reference_scores(logits[len(prompt) + i - 1], prompt, token_ids[:i], penalty,
                                  s.presence_penalty, s.frequency_penalty, s.logit_bias)
        rows.append(torch.log_softmax(scores, -1))
    return rows


@pytest.mark.parametrize("method", METHODS)
def test_logprobs_equal_a_transformers_forward_after_the_penalties(tiny_engine, method):
    sampling = dict(presence_penalty=0.5, frequency_penalty=0.4, logit_bias=((5, 2.0), (7, -1.5)),
                    logprobs=True, top_logprobs=3)
    result = _check_logprobs(tiny_engine, _req(method, speculative=False, **sampling))
    assert result.usage.draft_tokens == 0


def test_logprobs_of_speculative_tokens_are_the_same(tiny_engine):
    """Drafted tokens accepted in one verify step get the same log-probabilities."""
    drafted = 0
    for method in ("custom_cache", "prefix_cache", "paged"):
        request = _req(method, messages=COPY, speculative=True, max_new_tokens=40, repetition_penalty=1.0,
                       logit_bias=((5, 2.0),), logprobs=True, top_logprobs=2)
        drafted += _check_logprobs(tiny_engine, request).usage.accepted_draft_tokens
    assert drafted > 0  # the drafted path is the one checked


def _check_logprobs(engine, request):
    result = engine.generate(request)
    official = engine.generate(GenerationRequest(messages=request.messages, method="official",
                                                 sampling=request.sampling))
    assert result.token_ids == official.token_ids and len(result.token_ids) >= 4
    assert len(result.logprobs) == len(result.token_ids) == len(official.logprobs)
    penalty = request.sampling.repetition_penalty or engine.loaded.default_repetition_penalty
    top = request.sampling.top_logprobs
    for entry, token, want in zip(result.logprobs, result.token_ids,
                                  _forward_logprobs(engine, request, result.token_ids, penalty)):
        assert entry["token_id"] == token
        assert entry["logprob"] == pytest.approx(float(want[token]), abs=1e-4)
        values, ids = torch.topk(want, top)
        assert [i for i, _ in entry["top"]] == ids.tolist()
        assert [v for _, v in entry["top"]] == pytest.approx(values.tolist(), abs=1e-4)
    return result


def test_no_logprobs_unless_asked(tiny_engine):
    assert tiny_engine.generate(_req("paged")).logprobs is None


@pytest.mark.parametrize("method", METHODS)
def test_a_minus_100_bias_on_the_greedy_token_gives_the_next_best(tiny_engine, method):
    plain = tiny_engine.generate(_req(method, max_new_tokens=1, logprobs=True, top_logprobs=2))
    first, second = [i for i, _ in plain.logprobs[0]["top"]]
    banned = tiny_engine.generate(_req(method, max_new_tokens=1, logit_bias=((first, -100.0),)))
    assert plain.token_ids == [first] and banned.token_ids == [second]


@pytest.mark.parametrize("method", METHODS)
def test_frequency_penalty_reduces_repeats(tiny_engine, method):
    plain = tiny_engine.generate(_req(method, max_new_tokens=30, repetition_penalty=1.0))
    penalized = tiny_engine.generate(_req(method, max_new_tokens=30, repetition_penalty=1.0, frequency_penalty=2.0,
                                          presence_penalty=2.0))
    assert penalized.token_ids != plain.token_ids
    repeats = lambda ids: len(ids) - len(set(ids))  # noqa: E731
    assert repeats(penalized.token_ids) < repeats(plain.token_ids)


def test_each_row_of_a_paged_batch_has_its_own_bias(tiny_engine):
    alone = tiny_engine.generate(_req("paged", max_new_tokens=1, logprobs=True, top_logprobs=3))
    first, second, third = [i for i, _ in alone.logprobs[0]["top"]]
    biases = {"a": ((first, -100.0),), "b": ((first, -100.0), (second, -100.0))}
    gate = threading.Event()
    tiny_engine.loop.post(gate.wait)  # hold the loop: both requests join the same first step
    handles = {k: tiny_engine.loop.submit(_req("paged", max_new_tokens=6, logit_bias=b)) for k, b in biases.items()}
    gate.set()
    got = {k: h.result(timeout=60) for k, h in handles.items()}
    assert got["a"].token_ids[0] == second and got["b"].token_ids[0] == third
    for key, bias in biases.items():  # each row's whole answer is what it gives alone
        assert got[key].token_ids == tiny_engine.generate(_req("paged", max_new_tokens=6, logit_bias=bias)).token_ids
    assert tiny_engine.stats()["paged"]["max_batch_size"] >= 2


@pytest.mark.parametrize("method", ["official", "custom_cache", "paged"])
def test_grammar_with_a_bias_stays_valid(tiny_engine, method):
    schema = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 8}},
              "required": ["city"], "additionalProperties": False}
    tokenizer = tiny_engine.loaded.tokenizer
    quote = tokenizer.convert_tokens_to_ids(tokenizer.tokenize('"'))[0]
    result = tiny_engine.generate(_req(method, constraint=grammar.json_schema(schema), max_new_tokens=60,
                                       temperature=1.0, seed=3, logit_bias=((quote, -100.0),),
                                       presence_penalty=1.0))
    jsonschema.validate(json.loads(result.text), schema)


def test_the_stored_job_shape_becomes_sampling_params():
    from worker.job_runner import BadJobRequest
    from worker.requests import sampling_from

    params = sampling_from({"sampling": {"presence_penalty": 0.5, "logit_bias": [[3, -100], [9, 2.5]],
                                         "logprobs": True, "top_logprobs": 4}}, 16)
    assert params.logit_bias == ((3, -100.0), (9, 2.5)) and params.presence_penalty == 0.5
    assert params.logprobs and params.top_logprobs == 4 and params.max_new_tokens == 16
    assert sampling_from({"sampling": {}}, 16).logit_bias == ()
    with pytest.raises(BadJobRequest, match="logit_bias"):
        sampling_from({"sampling": {"logit_bias": {"12": 1}}}, 16)


def test_a_bias_outside_the_vocabulary_is_a_value_error_naming_the_field():
    with pytest.raises(ValueError, match="logit_bias"):
        Sampler(SamplingParams(logit_bias=((50, 1.0),)), 1.0, 50, [])
