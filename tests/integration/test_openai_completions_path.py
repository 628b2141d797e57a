"""The real ``openai`` client against the real stack (redis-server, a Celery worker with a tiny
random model whose tokenizer has fill-in-the-middle tokens, gunicorn): chat with ``n=3``,
logprobs, penalties and ``logit_bias``; ``completions.create`` with ``echo`` + ``logprobs``,
``suffix``, a list of prompts and streaming; a batch of completions. Every answer is parsed
by the client's own pydantic types (``model_validate``: strict, not the client's lenient
construct)."""
from __future__ import annotations

import io
import json
import time

import openai
import pytest
import requests
from openai.types import Batch, Completion
from openai.types.chat import ChatCompletion, ChatCompletionChunk

from tests.integration.conftest import _clean_stack, _started_worker, started_web, stack_store
from tests.tiny_model import make_tiny_model_dir

CHAT = [{"role": "user", "content": "Count with me: one two three"}]
CODE = "def add(a, b):\n    "


@pytest.fixture(scope="module")
def fim_model(tmp_path_factory):
    return make_tiny_model_dir(tmp_path_factory.mktemp("tiny-fim"), hidden_size=64, num_layers=2, fim_tokens=True)


@pytest.fixture(scope="module")
def fim_stack(redis_proc, fim_model):
    return _clean_stack(redis_proc, fim_model)


@pytest.fixture(scope="module")
def fim_store(fim_stack):
    return stack_store(fim_stack)


@pytest.fixture(scope="module")
def base_url(fim_stack, fim_store):
    worker = _started_worker(fim_stack, fim_store, MINISERVE_KV_BLOCK_SIZE="4")
    web, url = started_web(fim_stack)
    yield url
    web.kill()  # teardown: no graceful stop is under test here
    worker.kill()  # teardown: no graceful stop is under test here


@pytest.fixture(scope="module")
def client(base_url):
    with openai.OpenAI(base_url=f"{base_url}/v1", api_key="unused", max_retries=0, timeout=90) as c:
        yield c


@pytest.fixture(scope="module")
def model(fim_model):
    return fim_model.name


def job_of(store, answer_id: str):
    return store.get(answer_id.split("-", 1)[1])


def test_chat_n3_is_one_job_each_choice_its_own_seed(client, fim_store, model):
    ask = dict(model=model, messages=CHAT, max_tokens=8, temperature=1.0, logprobs=True, top_logprobs=2,
               presence_penalty=0.5, frequency_penalty=0.5, logit_bias={"5": -100})
    reply = ChatCompletion.model_validate(client.chat.completions.create(**ask, n=3, seed=11).model_dump())
    assert [c.index for c in reply.choices] == [0, 1, 2]
    alone = [client.chat.completions.create(**ask, seed=11 + i) for i in range(3)]
    assert [c.message.content for c in reply.choices] == [a.choices[0].message.content for a in alone]
    assert reply.usage.prompt_tokens == alone[0].usage.prompt_tokens            # the prompt counted once
    assert reply.usage.completion_tokens == sum(a.usage.completion_tokens for a in alone)
    assert all(len(t.top_logprobs) == 2 for c in reply.choices for t in c.logprobs.content)
    job = job_of(fim_store, reply.id)
    assert all(e["token_id"] != 5 for c in job.result["choices"] for e in c["logprobs"])  # logit_bias -100 bans it
    assert job.type == "chat" and job.request["n"] == 3
    shared = [c["usage"]["cached_tokens"] for c in job.result["choices"]]
    full_blocks = (reply.usage.prompt_tokens - 1) // 4 * 4
    assert shared == [0, full_blocks, full_blocks]                              # one prefill: blocks shared
    stream = client.chat.completions.create(**ask, n=3, seed=11, stream=True)
    texts = {0: "", 1: "", 2: ""}
    streamed = {0: [], 1: [], 2: []}
    for chunk in stream:
        chunk = ChatCompletionChunk.model_validate(chunk.model_dump())
        for choice in chunk.choices:
            texts[choice.index] += choice.delta.content or ""
            if choice.logprobs and choice.logprobs.content:
                streamed[choice.index] += choice.logprobs.content
    assert [texts[i] for i in range(3)] == [c.message.content for c in reply.choices]
    for i, choice in enumerate(reply.choices):
        assert [t.bytes for t in streamed[i]] == [t.bytes for t in choice.logprobs.content]


def _validated(answer) -> Completion:
    """``Completion.model_validate`` after checking the first echoed token's nulls (vLLM's
    shape, which the client's type cannot hold)."""
    data = answer.model_dump()
    for choice in data["choices"]:
        lp = choice["logprobs"]
        if lp and lp["token_logprobs"] and lp["token_logprobs"][0] is None:
            assert lp["top_logprobs"][0] is None
            lp["token_logprobs"][0], lp["top_logprobs"][0] = 0.0, {}
    return Completion.model_validate(data)


def test_completion_with_echo_and_logprobs(client, fim_store, model, base_url):
    prompt = "The quick brown fox jumps"
    answer = client.completions.create(model=model, prompt=prompt, max_tokens=6, echo=True, logprobs=2)
    parsed = _validated(answer)
    choice = answer.choices[0]
    assert parsed.object == "text_completion" and choice.text.startswith(prompt)
    lp = choice.logprobs
    prompt_ids = requests.post(f"{base_url}/tokenize", json={"prompt": prompt}, timeout=10).json()["tokens"]
    assert parsed.usage.prompt_tokens == len(prompt_ids)
    assert lp.token_logprobs[0] is None and all(v <= 0 for v in lp.token_logprobs[1:])
    assert "".join(lp.tokens[:len(prompt_ids)]) == prompt
    assert len(lp.tokens) == len(prompt_ids) + len(job_of(fim_store, answer.id).result["logprobs"])
    # a random model writes partial characters: such a token's text shows U+FFFD (legacy
    # logprobs have no bytes); every other token stands where its offset says
    assert all(choice.text[o:].startswith(t) for o, t in zip(lp.text_offset, lp.tokens) if "\ufffd" not in t)
    assert lp.text_offset[len(prompt_ids)] == len(prompt)
    for token, value, top in zip(lp.tokens[1:], lp.token_logprobs[1:], lp.top_logprobs[1:]):
        assert top[token] == value and len(top) <= 3
    job = job_of(fim_store, answer.id)
    assert job.type == "completion" and job.request["prompts"] == [prompt]
    assert job.request["sampling"]["prompt_logprobs"] == 2


def test_fill_in_the_middle_with_suffix(client, fim_store, model, base_url):
    answer = Completion.model_validate(client.completions.create(
        model=model, prompt=CODE, suffix="\n\nprint(add(1, 2))", max_tokens=6).model_dump())
    job = job_of(fim_store, answer.id)
    fim = f"<|fim_prefix|>{CODE}<|fim_suffix|>\n\nprint(add(1, 2))<|fim_middle|>"
    assert job.request["prompts"] == [fim]
    counted = requests.post(f"{base_url}/tokenize", json={"prompt": fim, "return_token_strs": True}, timeout=10).json()
    assert {"<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>"} <= set(counted["token_strs"])  # one token each
    assert answer.usage.prompt_tokens == counted["count"]
    assert answer.choices[0].text == job.result["text"]


def test_streamed_completion_of_two_prompts_n2(client, model):
    ask = dict(model=model, prompt=["Hello, world!", "你好，世界"], max_tokens=8, n=2, temperature=0.7, seed=3,
               logprobs=1)
    whole = _validated(client.completions.create(**ask))
    assert [c.index for c in whole.choices] == [0, 1, 2, 3]
    texts, offsets = {i: "" for i in range(4)}, {i: [] for i in range(4)}
    finishes = {}
    chunks = list(client.completions.create(**ask, stream=True, stream_options={"include_usage": True}))
    for chunk in chunks[:-1]:
        (choice,) = chunk.choices
        data = chunk.model_dump()
        if choice.finish_reason is None:  # the client's type has no null finish_reason: check the rest
            data["choices"][0]["finish_reason"] = "stop"
        Completion.model_validate(data)
        texts[choice.index] += choice.text
        if choice.logprobs:
            offsets[choice.index] += choice.logprobs.text_offset
        if choice.finish_reason:
            finishes[choice.index] = choice.finish_reason
    assert [texts[i] for i in range(4)] == [c.text for c in whole.choices]
    assert [offsets[i] for i in range(4)] == [c.logprobs.text_offset for c in whole.choices]
    assert finishes == {c.index: c.finish_reason for c in whole.choices}
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == whole.usage.completion_tokens


def test_refusals_name_their_field(client, model):
    for body, param in [({"prompt": [1, 2, 3]}, "prompt"), ({"prompt": "x", "best_of": 3}, "best_of"),
                        ({"prompt": "x", "echo": True, "suffix": "y"}, "echo")]:
        with pytest.raises(openai.BadRequestError) as info:
            client.completions.create(model=model, max_tokens=2, **body)
        assert info.value.body["param"] == param


def test_a_batch_of_completions(client, model):
    lines = [json.dumps({"custom_id": f"c{i}", "method": "POST", "url": "/v1/completions",
                         "body": {"model": model, "prompt": f"Line {i}:", "max_tokens": 4}}) for i in range(3)]
    uploaded = client.files.create(file=("in.jsonl", io.BytesIO("\n".join(lines).encode())), purpose="batch")
    batch = client.batches.create(input_file_id=uploaded.id, endpoint="/v1/completions", completion_window="24h")
    deadline = time.monotonic() + 90
    while batch.status not in ("completed", "failed", "cancelled", "expired") and time.monotonic() < deadline:
        time.sleep(0.5)
        batch = client.batches.retrieve(batch.id)
    assert Batch.model_validate(batch.model_dump()).status == "completed" and batch.request_counts.completed == 3
    output = [json.loads(x) for x in client.files.content(batch.output_file_id).text.splitlines()]
    direct = client.completions.create(model=model, prompt="Line 0:", max_tokens=4)
    bodies = [Completion.model_validate(o["response"]["body"]) for o in output]
    assert [o["custom_id"] for o in output] == ["c0", "c1", "c2"]
    assert bodies[0].choices[0].text == direct.choices[0].text
