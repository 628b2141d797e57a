"""The real ``ollama`` Python client against the real stack (redis-server, a Celery worker with
a tiny random model whose tokenizer has fill-in-the-middle tokens, the web server): ``chat``
plain and streamed (the same greedy answer), ``chat`` with ``format`` set to a JSON Schema
(the random model's answer parses and validates only because the grammar holds it),
``generate`` (templated, and fill-in-the-middle), ``list``, ``show`` and ``ps``, and a refused
option. Answers are the client's own pydantic types."""
from __future__ import annotations

import json

import jsonschema
import ollama
import pytest

from tests.integration.conftest import _clean_stack, _started_worker, started_web, stack_store
from tests.tiny_model import make_tiny_model_dir

pytestmark = pytest.mark.integration

CITY = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 6},
                                         "unit": {"enum": ["celsius", "fahrenheit"]}},
        "required": ["city", "unit"], "additionalProperties": False}
HELLO = [{"role": "user", "content": "Count with me: one two three"}]


@pytest.fixture(scope="module")
def fim_model(tmp_path_factory):
    return make_tiny_model_dir(tmp_path_factory.mktemp("tiny-fim"), hidden_size=64, num_layers=2, fim_tokens=True)


@pytest.fixture(scope="module")
def fim_stack(redis_proc, fim_model):
    return _clean_stack(redis_proc, fim_model)


@pytest.fixture(scope="module")
def client(fim_stack):
    worker = _started_worker(fim_stack, stack_store(fim_stack))
    web, url = started_web(fim_stack)
    yield ollama.Client(host=url, timeout=120)
    web.kill()  # teardown: no graceful stop is under test here
    worker.kill()  # teardown: no graceful stop is under test here


@pytest.fixture(scope="module")
def name(fim_model):
    return f"{fim_model.name}:latest"


def test_chat_plain_and_streamed_give_the_same_greedy_answer(client, name, fim_model):
    plain = client.chat(model=name, messages=HELLO, options={"num_predict": 8, "seed": 1})
    assert isinstance(plain, ollama.ChatResponse) and plain.done and plain.done_reason in ("stop", "length")
    assert plain.model == fim_model.name and plain.message.role == "assistant"
    assert 1 <= plain.eval_count <= 8 and plain.prompt_eval_count > 0
    parts = list(client.chat(model=name, messages=HELLO, options={"num_predict": 8, "seed": 1}, stream=True))
    assert [p.done for p in parts] == [False] * (len(parts) - 1) + [True]
    assert "".join(p.message.content or "" for p in parts) == plain.message.content
    assert (parts[-1].eval_count, parts[-1].done_reason) == (plain.eval_count, plain.done_reason)


def test_any_name_reaches_the_only_model(client, fim_model):
    assert client.chat(model="llama3.2", messages=HELLO, options={"num_predict": 2}).model == fim_model.name


@pytest.mark.parametrize("stream", [False, True])
def test_chat_with_a_schema_format_parses_and_validates(client, name, stream):
    kwargs = dict(model=name, messages=[{"role": "user", "content": "Weather city?"}], format=CITY,
                  options={"num_predict": 60, "temperature": 1.0, "seed": 7})
    if stream:
        parts = list(client.chat(stream=True, **kwargs))
        text, last = "".join(p.message.content or "" for p in parts), parts[-1]
    else:
        last = client.chat(**kwargs)
        text = last.message.content
    assert last.done_reason == "stop", text
    jsonschema.validate(json.loads(text), CITY)


def test_generate_templated_and_fill_in_the_middle(client, name):
    answer = client.generate(model=name, prompt="Say hi", system="Be brief.", options={"num_predict": 4})
    assert isinstance(answer, ollama.GenerateResponse) and answer.done and 1 <= answer.eval_count <= 4
    middle = client.generate(model=name, prompt="def add(a, b):\n    ", suffix="\n\nprint(add(1, 2))",
                             options={"num_predict": 4})
    assert middle.done and isinstance(middle.response, str) and 1 <= middle.eval_count <= 4
    streamed = list(client.generate(model=name, prompt="Say hi", system="Be brief.", options={"num_predict": 4},
                                    stream=True))
    assert "".join(p.response for p in streamed) == answer.response and streamed[-1].done


def test_list_show_and_ps(client, name, fim_model):
    assert [m.model for m in client.list().models] == [name]
    shown = client.show(name)
    assert "insert" in shown.capabilities and "completion" in shown.capabilities
    assert shown.modelinfo["general.basename"] == fim_model.name
    running = client.ps().models
    assert [m.model for m in running] == [name]
    assert running[0].context_length == 4096


def test_an_option_it_does_not_take_is_a_400_naming_it(client, name):
    with pytest.raises(ollama.ResponseError) as info:
        client.chat(model=name, messages=HELLO, options={"mirostat": 2})
    assert info.value.status_code == 400 and info.value.error.startswith("options.mirostat:")
