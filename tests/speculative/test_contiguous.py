"""Speculative ``custom_cache`` / ``prefix_cache``: token-for-token greedy equality with
speculation off (fp32, several model shapes), the same streamed pieces, stop strings, EOS,
max tokens and cancellation, and an unchanged sampling distribution."""
from __future__ import annotations

from collections import Counter

import pytest

from core.settings import load_settings
from engine.engine import Engine
from engine.run import GenerationRun
from engine.types import CANCELLED, STOP, GenerationRequest, SamplingParams
from tests.speculative.stats import chi_square_p
from tests.tiny_model import make_tiny_model_dir

SHAPES = {
    "untied-gqa4:2": {},
    "tied-gqa6:1": {"tie_word_embeddings": True, "hidden_size": 48, "num_heads": 6, "num_kv_heads": 1},
    "mha-headdim24": {"head_dim": 24, "num_heads": 4, "num_kv_heads": 4, "repetition_penalty": 1.3},
}
COPY = [{"role": "user", "content": "Rename foo to bar: def foo(x): return foo(x - 1) + foo(x - 2)\n"
                                    "def foo(x): return foo(x - 1) + foo(x - 2)"}]
METHODS = ("custom_cache", "prefix_cache")


@pytest.fixture(scope="module", params=list(SHAPES))
def engine(request, tmp_path_factory):
    folder = make_tiny_model_dir(tmp_path_factory.mktemp(request.param), **SHAPES[request.param])
    return Engine(load_settings(model=str(folder), dtype="float32", device="cpu",
                                spec_tokens=4, spec_ngram=(3, 2, 1)))


def _req(method, speculative, messages=COPY, prefix=None, **sampling):
    sampling.setdefault("max_new_tokens", 40)
    return GenerationRequest(messages=messages, method=method, prefix=prefix, speculative=speculative,
                             sampling=SamplingParams(**sampling))


def _generate(engine, request):
    pieces: list[str] = []
    result = engine.generate(request, on_text=pieces.append)
    return result, pieces


@pytest.mark.parametrize("penalty", [1.0, None])
def test_greedy_identical_with_and_without_speculation(engine, penalty):
    drafted = accepted = 0
    for method in METHODS:
        for prefix in (None, "Keep names consistent."):
            off, off_pieces = _generate(engine, _req(method, False, prefix=prefix, repetition_penalty=penalty))
            on, on_pieces = _generate(engine, _req(method, True, prefix=prefix, repetition_penalty=penalty))
            assert on.token_ids == off.token_ids, (method, prefix)
            assert on_pieces == off_pieces and on.text == off.text
            assert on.finish_reason == off.finish_reason
            assert on.usage.completion_tokens == off.usage.completion_tokens
            assert off.usage.draft_tokens == 0
            drafted += on.usage.draft_tokens
            accepted += on.usage.accepted_draft_tokens
    assert drafted > 0 and 0 < accepted <= drafted


def test_setting_decides_when_the_request_does_not(tiny_model_dir):
    settings = dict(model=str(tiny_model_dir), dtype="float32", device="cpu", spec_ngram=(2, 1))
    on = Engine(load_settings(speculative="ngram", **settings)).generate(_req("custom_cache", None))
    off = Engine(load_settings(speculative="off", **settings)).generate(_req("custom_cache", None))
    assert on.usage.draft_tokens > 0 and off.usage.draft_tokens == 0
    assert on.token_ids == off.token_ids


def test_stop_string_and_max_tokens_as_without(engine):
    base, _ = _generate(engine, _req("custom_cache", False, max_new_tokens=30))
    stop = base.text[len(base.text) // 2:len(base.text) // 2 + 3]
    cases = [dict(stop=(stop,)), dict(max_new_tokens=7), dict(max_new_tokens=1)]
    for sampling in cases:
        off, off_pieces = _generate(engine, _req("custom_cache", False, **sampling))
        on, on_pieces = _generate(engine, _req("custom_cache", True, **sampling))
        assert (on.token_ids, on.text, on.finish_reason) == (off.token_ids, off.text, off.finish_reason)
        assert on_pieces == off_pieces


def _direct(engine, request, cancel_after):
    """The method runner called directly with a run whose cancel check counts its calls:
    through ``engine.generate`` a cancel is polled asynchronously, so only this path makes
    "cancelled after N checks" deterministic. ``engine`` must never start its loop."""
    loaded, pieces, calls = engine.loaded, [], [0]

    def should_cancel():
        calls[0] += 1
        return calls[0] > cancel_after

    prompt = engine.prompt(request)
    run = GenerationRun(loaded.tokenizer, method=request.method, max_new_tokens=request.sampling.max_new_tokens,
                        eos_ids=loaded.eos_ids, on_text=pieces.append, should_cancel=should_cancel)
    engine._methods[request.method](engine, prompt, run, request, loaded.default_repetition_penalty)
    return run.result(prompt_tokens=len(prompt.ids)), pieces


def test_cancellation_as_without(tiny_model_dir):
    engine = Engine(load_settings(model=str(tiny_model_dir), dtype="float32", device="cpu", spec_ngram=(2, 1)))
    for after in (0, 3, 11):
        off, off_pieces = _direct(engine, _req("custom_cache", False), after)
        on, on_pieces = _direct(engine, _req("custom_cache", True), after)
        assert (on.token_ids, on.finish_reason) == (off.token_ids, off.finish_reason)
        assert on_pieces == off_pieces
        assert off.finish_reason == CANCELLED and len(off.token_ids) == after


def test_eos_inside_the_accepted_drafts_ends_the_run(engine, monkeypatch):
    """EOS as the model's own greedy choice: declare a mid-answer token end-of-sequence."""
    off = engine.generate(_req("custom_cache", False, max_new_tokens=25))
    eos = off.token_ids[9]
    config = engine.loaded.model.generation_config
    monkeypatch.setattr(config, "eos_token_id", [*engine.loaded.eos_ids, eos])
    a = engine.generate(_req("custom_cache", False, max_new_tokens=25))
    b = engine.generate(_req("custom_cache", True, max_new_tokens=25))
    assert a.finish_reason == b.finish_reason == STOP
    assert a.token_ids == b.token_ids == off.token_ids[:off.token_ids.index(eos)]
    assert a.usage.completion_tokens == b.usage.completion_tokens


def test_sampled_tokens_keep_their_distribution(tiny_engine):
    """Token histograms at a position reached through verified drafts, 300 seeds each."""
    engine = Engine(load_settings(model=tiny_engine.settings.model, dtype="float32", device="cpu",
                                  spec_tokens=3, spec_ngram=(1,)))
    hist = {False: Counter(), True: Counter()}
    drafted = 0
    for speculative in (False, True):
        for seed in range(300):
            result = engine.generate(_req("custom_cache", speculative, max_new_tokens=6,
                                          temperature=1.0, top_k=30, seed=seed + 1000 * speculative))
            hist[speculative][tuple(result.token_ids[2:3])] += 1
            drafted += result.usage.draft_tokens
    assert drafted > 300
    assert chi_square_p(hist[False], hist[True]) > 1e-3
