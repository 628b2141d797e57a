"""The real ``openai`` client against the running service (real redis-server, Celery worker
with a tiny random model, gunicorn web): plain, streamed, tools, usage, errors, disconnect."""
from __future__ import annotations

import json

import openai
import pytest
import requests

from core.events import TERMINAL_STATES
from tests.harness.stack import wait_until

MESSAGES = [{"role": "system", "content": "You are a terse assistant."},
            {"role": "user", "content": "Hello, how are you today?"}]
CALC = {"type": "function", "function": {"name": "calculator", "description": "Evaluate arithmetic",
                                         "parameters": {"type": "object", "properties": {"expression": {"type": "string"}},
                                                        "required": ["expression"]}}}


@pytest.fixture(scope="module")
def client(base_url):
    with openai.OpenAI(base_url=f"{base_url}/v1", api_key="unused", max_retries=0, timeout=60) as c:
        yield c


def test_models_lists_the_served_model(client, tiny_model):
    models = client.models.list().data
    assert [m.id for m in models] == [tiny_model.name]


def test_models_retrieve_the_served_model_and_a_missing_one(client, tiny_model):
    model = client.models.retrieve(tiny_model.name)
    assert isinstance(model, openai.types.Model) and model.id == tiny_model.name and model.object == "model"
    with pytest.raises(openai.NotFoundError) as info:
        client.models.retrieve("gpt-4o")
    assert info.value.body["code"] == "model_not_found"


def test_refused_and_no_effect_fields_through_the_client(client, served_model):
    messages = [{"role": "user", "content": "Fields?"}]  # not MESSAGES: its prefix would be cached
    for field, value in [("store", True), ("prediction", {"type": "content", "content": "x"})]:
        with pytest.raises(openai.BadRequestError) as info:
            client.chat.completions.create(model=served_model, messages=messages, max_tokens=2, **{field: value})
        assert info.value.body["param"] == field and "not supported" in info.value.body["message"]
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model=served_model, messages=messages, max_tokens=2, extra_body={"min_p": 1.5})
    assert info.value.body["param"] == "min_p"
    reply = client.chat.completions.create(model=served_model, messages=messages, max_tokens=2, user="u1",
                                           metadata={"k": "v"}, store=False, service_tier="auto",
                                           presence_penalty=0, n=1)
    assert reply.choices[0].finish_reason in ("stop", "length")


def test_logprobs_penalties_and_bias_through_the_client(client, surface_store, served_model):
    """Checked against the client's own types (strict pydantic validation, not its lenient parse)."""
    from openai.types.chat import ChatCompletion, ChatCompletionChunk

    messages = [{"role": "user", "content": "Count with me: one two three"}]
    ask = dict(model=served_model, messages=messages, max_tokens=8, temperature=0, logprobs=True, top_logprobs=3)
    plain = ChatCompletion.model_validate(client.chat.completions.create(**ask).model_dump())
    content = plain.choices[0].logprobs.content
    assert 1 <= len(content) <= plain.usage.completion_tokens
    first = content[0]
    assert len(first.top_logprobs) == 3 and first.top_logprobs[0].logprob >= first.top_logprobs[-1].logprob
    assert first.logprob == first.top_logprobs[0].logprob  # greedy: the most likely token
    assert b"".join(bytes(c.bytes) for c in content).decode("utf-8", "replace") == plain.choices[0].message.content
    first_id = surface_store.get(plain.id.removeprefix("chatcmpl-")).result["logprobs"][0]["token_id"]
    banned = client.chat.completions.create(**ask, logit_bias={str(first_id): -100})
    second = banned.choices[0].logprobs.content[0]
    assert second.token == first.top_logprobs[1].token  # the next best, under the same distribution
    penalized = client.chat.completions.create(**ask, presence_penalty=2.0, frequency_penalty=2.0)
    ChatCompletion.model_validate(penalized.model_dump())
    stream = client.chat.completions.create(**ask, stream=True)
    chunks = [ChatCompletionChunk.model_validate(c.model_dump()) for c in stream]
    streamed = [t for c in chunks for ch in c.choices if ch.logprobs and ch.logprobs.content for t in ch.logprobs.content]
    assert [t.bytes for t in streamed] == [t.bytes for t in content]  # a second run: same tokens,
    assert [t.logprob for t in streamed] == pytest.approx([t.logprob for t in content], abs=1e-4)  # fp32 sums


def test_tokenize_and_detokenize_over_http(base_url):
    counted = requests.post(f"{base_url}/tokenize", json={"prompt": "Hello there"}, timeout=10).json()
    assert counted["count"] == len(counted["tokens"]) > 0
    text = requests.post(f"{base_url}/detokenize", json={"tokens": counted["tokens"]}, timeout=10).json()
    assert text == {"prompt": "Hello there"}


def test_plain_completion_with_usage(client, surface_store, served_model):
    reply = client.chat.completions.create(model=served_model, messages=MESSAGES, max_tokens=12, temperature=0)
    choice = reply.choices[0]
    assert reply.object == "chat.completion" and choice.message.role == "assistant"
    assert isinstance(choice.message.content, str) and choice.finish_reason in ("stop", "length")
    usage = reply.usage
    assert usage.prompt_tokens > 10 and 1 <= usage.completion_tokens <= 12
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens
    assert usage.prompt_tokens_details.cached_tokens == 0
    job = surface_store.get(reply.id.removeprefix("chatcmpl-"))
    assert job.type == "chat" and job.state == "succeeded"
    assert job.result["text"] == choice.message.content
    assert job.result["usage"]["completion_tokens"] == usage.completion_tokens


def test_streamed_deltas_equal_the_greedy_completion(client, served_model):
    plain = client.chat.completions.create(model=served_model, messages=MESSAGES, max_tokens=20, temperature=0)
    stream = client.chat.completions.create(model=served_model, messages=MESSAGES, max_tokens=20, temperature=0,
                                            stream=True, stream_options={"include_usage": True})
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == plain.choices[0].message.content
    finals = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finals == [plain.choices[0].finish_reason]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == plain.usage.completion_tokens
    assert len({c.id for c in chunks}) == 1 and chunks[0].id != plain.id


def test_prefix_cache_reports_cached_prompt_tokens(client, served_model):
    first = client.chat.completions.create(model=served_model, messages=MESSAGES, max_tokens=4,
                                           extra_body={"generation_method": "prefix_cache"})
    second = client.chat.completions.create(model=served_model, messages=MESSAGES, max_tokens=4,
                                            extra_body={"generation_method": "prefix_cache"})
    assert second.miniserve["generation_method"] == "prefix_cache"
    assert second.usage.prompt_tokens_details.cached_tokens > 0
    assert second.choices[0].message.content == first.choices[0].message.content


def test_tools_are_rendered_for_the_model_and_tool_choice_none_hides_them(client, surface_store, served_model):
    with_tools = client.chat.completions.create(model=served_model, messages=MESSAGES, max_tokens=12, tools=[CALC])
    stored = surface_store.get(with_tools.id.removeprefix("chatcmpl-")).request
    assert stored["tools"] == [CALC]
    assert with_tools.usage.prompt_tokens > 60  # the tools section is in the prompt
    calls = with_tools.choices[0].message.tool_calls or []
    assert all(c.function.name == "calculator" and "expression" in json.loads(c.function.arguments) for c in calls)
    assert (with_tools.choices[0].finish_reason == "tool_calls") == bool(calls)
    hidden = client.chat.completions.create(model=served_model, messages=MESSAGES, max_tokens=12, tools=[CALC],
                                            tool_choice="none")
    plain = client.chat.completions.create(model=served_model, messages=MESSAGES, max_tokens=12)
    assert hidden.choices[0].message.content == plain.choices[0].message.content
    assert hidden.usage.prompt_tokens == plain.usage.prompt_tokens < with_tools.usage.prompt_tokens


def test_bad_requests_raise_openai_errors(client, served_model):
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model=served_model, messages=MESSAGES, temperature=7)
    assert info.value.status_code == 400
    assert info.value.body["type"] == "invalid_request_error" and info.value.body["param"] == "temperature"
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model=served_model, messages=MESSAGES, tools=[CALC],
                                       tool_choice={"type": "function", "function": {"name": "shell"}})
    assert info.value.body["param"] == "tool_choice"


def test_a_client_that_disconnects_mid_stream_cancels_its_job(base_url, surface_store, served_model):
    body = {"model": served_model, "messages": MESSAGES, "max_tokens": 2000, "stream": True,
            "stop": ["<never-happens>"], "repetition_penalty": 1.0}
    with requests.post(f"{base_url}/v1/chat/completions", json=body, stream=True, timeout=30) as response:
        job_id = response.headers["X-Job-Id"]
        lines = response.iter_lines()
        content_chunks = 0
        while content_chunks < 3:
            line = next(lines)
            if line.startswith(b"data: {") and b'"content": "' in line and b'"content": ""' not in line:
                content_chunks += 1
    # the connection is closed here, long before 2000 tokens
    wait_until(lambda: surface_store.get(job_id).state in TERMINAL_STATES, 30, what="the job to end")
    job = surface_store.get(job_id)
    assert job.state == "cancelled", job.state
    assert job.error["partial"]["usage"]["completion_tokens"] < 2000
