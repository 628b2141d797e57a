"""``POST /v1/completions`` (and ``n`` on chat) on fakeredis with a fake worker: every field
of the ``openai`` client's ``CompletionCreateParams`` honoured, without effect or refused;
the stored ``completion`` job; legacy logprobs, echo, fill-in-the-middle; streamed chunks
with their index and their tokens' logprobs; the Batch API with this endpoint."""
from __future__ import annotations

import json
import re
import typing

import pytest

from core.events import SUCCEEDED
from core.model_source import model_id
from core.workers import write_heartbeat
from tests.tiny_model import make_tiny_model_dir
from tests.web.test_openai_api import data_lines
from tests.web.test_openai_batch import intake_done
from web.openai.completion_fields import COMPLETION_FIELDS
from web.openai.completion_schemas import CompletionRequest
from web.tokenizer import load_tokenizer

OPENAI_COMPLETION_FIELDS = (
    "best_of", "echo", "frequency_penalty", "logit_bias", "logprobs", "max_tokens", "model", "n",
    "presence_penalty", "prompt", "seed", "stop", "stream", "stream_options", "suffix", "temperature",
    "top_p", "user",
)
PROMPT = "def add(a, b):"
HONOURED = {
    "prompt": ({}, {"prompt": "Hello, world!"}),
    "model": ({}, {"model": "another-model"}),
    "max_tokens": ({}, {"max_tokens": 7}),
    "temperature": ({}, {"temperature": 0.5}),
    "top_p": ({}, {"top_p": 0.5}),
    "seed": ({}, {"seed": 3}),
    "stop": ({}, {"stop": "x"}),
    "stream": ({}, {"stream": True}),
    "stream_options": ({"stream": True}, {"stream": True, "stream_options": {"include_usage": True}}),
    "n": ({}, {"n": 2}),
    "echo": ({}, {"echo": True}),
    "logprobs": ({}, {"logprobs": 2}),
    "suffix": ({}, {"suffix": "    return a + b"}),
    "presence_penalty": ({}, {"presence_penalty": 0.5}),
    "frequency_penalty": ({}, {"frequency_penalty": -1.0}),
    "logit_bias": ({}, {"logit_bias": {"42": -100}}),
}
NO_EFFECT = {"user": "u-1"}
REFUSED = {"best_of": (3, 1)}


@pytest.fixture(scope="module")
def fim_folder(tmp_path_factory):
    return make_tiny_model_dir(tmp_path_factory.mktemp("tiny-fim"), hidden_size=32, num_layers=1, fim_tokens=True)


@pytest.fixture(scope="module")
def plain_folder(tmp_path_factory):
    return make_tiny_model_dir(tmp_path_factory.mktemp("tiny-nofim"), hidden_size=32, num_layers=1)


@pytest.fixture
def app_client(make_app, fim_folder):
    return make_app(model=str(fim_folder)).test_client()


def ids_of(folder, text: str) -> list[int]:
    return load_tokenizer(folder).encode(text, add_special_tokens=False).ids


def worker_answers(store, celery, texts: list[str], folder, n: int = 1, prompt_ids=None, chunks=None):
    """The fake worker: choice i answers ``texts[i]`` (token by token of the tiny tokenizer,
    each event with its index and logprob entry), as worker/choices.py shapes a group."""
    def entries(text):
        return [{"token_id": t, "logprob": -0.5 - i / 10, "top": [[t, -0.5 - i / 10], [3, -2.0]]}
                for i, t in enumerate(ids_of(folder, text))]

    def run(job_id):
        started = store.start_attempt(job_id, "fake-worker", lease_s=30)
        for index, text in enumerate(texts):
            for entry in entries(text):
                piece = load_tokenizer(folder).decode([entry["token_id"]])
                data = {"text": piece, "logprobs": [entry], **({"index": index} if index else {})}
                store.append_event(job_id, started.attempt, "token", data)
        prompt_lp = None
        if prompt_ids:
            prompt_lp = [{"token_id": prompt_ids[0], "logprob": None, "top": []}] + \
                [{"token_id": t, "logprob": -1.0, "top": [[t, -1.0]]} for t in prompt_ids[1:]]
        choices = [{"index": i, "prompt_index": i // n, "text": t, "finish_reason": "length",
                    "logprobs": entries(t), "prompt_logprobs": prompt_lp,
                    "usage": {"prompt_tokens": 4, "completion_tokens": 3, "cached_tokens": 0}}
                   for i, t in enumerate(texts)]
        payload = {"text": texts[0], "finish_reason": "length", "method": "paged", "logprobs": entries(texts[0]),
                   "prompt_logprobs": prompt_lp,
                   "usage": {"prompt_tokens": 4 * len(texts) // n, "completion_tokens": 3 * len(texts),
                             "cached_tokens": 0},
                   "timings": {"ttft_s": 0.01, "total_s": 0.02, "decode_tokens_per_s": 100.0}}
        if len(texts) > 1:
            payload["choices"] = choices
        store.finish(job_id, SUCCEEDED, payload, attempt=started.attempt)
    celery.runner = run


def complete(client, **body):
    return client.post("/v1/completions", json={"prompt": PROMPT, **body})


# ---- the field table ---------------------------------------------------------------------------
def test_the_list_is_the_installed_clients():
    from openai.types import completion_create_params as params
    assert set(OPENAI_COMPLETION_FIELDS) == set(typing.get_type_hints(params.CompletionCreateParamsBase)) | {"stream"}


def test_every_field_is_classified_once():
    extensions = {name for name, rule in COMPLETION_FIELDS.items() if rule.extension}
    assert set(COMPLETION_FIELDS) - extensions == set(OPENAI_COMPLETION_FIELDS)
    assert set(CompletionRequest.model_fields) == set(COMPLETION_FIELDS)
    by_kind = {kind: {n for n in OPENAI_COMPLETION_FIELDS if COMPLETION_FIELDS[n].kind == kind}
               for kind in ("honoured", "no_effect", "refused")}
    assert by_kind == {"honoured": set(HONOURED), "no_effect": set(NO_EFFECT), "refused": set(REFUSED)}


def fingerprint(client, store, **body) -> tuple:
    response = complete(client, **body)
    assert response.status_code == 200, response.get_json()
    job_id = response.headers["X-Job-Id"]
    text = re.sub(r'"created": ?\d+', "", response.get_data(as_text=True).replace(job_id, "<job>"))
    return json.dumps(store.get(job_id).request, sort_keys=True), response.mimetype, text


@pytest.mark.parametrize("name", sorted(HONOURED))
def test_an_honoured_field_changes_the_job_or_the_answer(app_client, store, celery, fim_folder, name):
    worker_answers(store, celery, [" return"], fim_folder)
    for worker, model in (("a@h:1", model_id(str(fim_folder))), ("b@h:1", "another-model")):
        write_heartbeat(store.client, worker, {"model_id": model})
    without, with_field = HONOURED[name]
    assert fingerprint(app_client, store, **without) != fingerprint(app_client, store, **with_field)


def test_a_no_effect_field_changes_nothing_and_is_type_checked(app_client, store, celery, fim_folder):
    worker_answers(store, celery, [" return"], fim_folder)
    assert fingerprint(app_client, store) == fingerprint(app_client, store, user="u-1")
    response = complete(app_client, user=5)
    assert response.status_code == 400 and response.get_json()["error"]["param"] == "user"


def test_best_of_other_than_1_or_n_is_a_400_naming_it(app_client, store, celery, fim_folder):
    worker_answers(store, celery, [" a", " b"], fim_folder, n=2)
    for body in ({"best_of": 3}, {"best_of": 3, "n": 2}, {"best_of": 2}):
        error = complete(app_client, **body).get_json()["error"]
        assert error["param"] == "best_of" and "not supported" in error["message"], body
    assert complete(app_client, best_of=1).status_code == 200
    assert complete(app_client, best_of=2, n=2).status_code == 200


def test_docs_api_table_is_the_code_table():
    from pathlib import Path
    text = (Path(__file__).resolve().parents[2] / "docs" / "api.md").read_text()
    section = text[text.index("### `POST /v1/completions`: every request field"):]
    section = section[:section.index("\n### ", 1)]
    rows = dict(re.findall(r"^\| `([a-z_]+)` \| (honoured|no_effect|refused) \|", section, re.MULTILINE))
    assert rows == {name: rule.kind for name, rule in COMPLETION_FIELDS.items()}


# ---- the job ----------------------------------------------------------------------------------
def test_a_completion_is_a_completion_job_with_raw_prompts(app_client, store, celery, fim_folder):
    worker_answers(store, celery, [" x"] * 4, fim_folder, n=2)
    response = complete(app_client, prompt=["one", "two"], n=2, seed=5, logprobs=3, echo=True, stop=["\n"])
    assert response.status_code == 200, response.get_json()
    job = store.get(response.headers["X-Job-Id"])
    assert job.type == "completion" and job.request["messages"] == [] and job.request["n"] == 2
    assert job.request["prompts"] == ["one", "two"]
    assert job.request["sampling"] == {"max_new_tokens": 16, "temperature": 0.0, "top_p": 1.0, "top_k": 0,
                                       "repetition_penalty": None, "seed": 5, "stop": ["\n"],
                                       "logprobs": True, "top_logprobs": 3, "prompt_logprobs": 3}


def test_suffix_is_fill_in_the_middle_with_the_tokenizers_fim_tokens(app_client, store, celery, fim_folder):
    worker_answers(store, celery, [" a + b"], fim_folder)
    response = complete(app_client, suffix="\n    return c")
    assert store.get(response.headers["X-Job-Id"]).request["prompts"] == [
        f"<|fim_prefix|>{PROMPT}<|fim_suffix|>\n    return c<|fim_middle|>"]
    assert response.get_json()["choices"][0]["text"] == " a + b"


@pytest.mark.parametrize("body, param", [
    ({"prompt": [1, 2, 3]}, "prompt"), ({"prompt": [[1, 2]]}, "prompt"), ({"prompt": []}, "prompt"),
    ({"prompt": ""}, "prompt"), ({"prompt": ["a", ""]}, "prompt.1"), ({"suffix": "x", "echo": True}, "echo"),
    ({"stream": True, "echo": True, "logprobs": 1}, "echo"), ({"prompt": ["a"] * 5, "n": 16}, "n"),
    ({"n": 17}, "n"), ({"logprobs": 21}, "logprobs"), ({"logprobs": True}, "logprobs"),
    ({"max_tokens": 10**9}, "max_tokens"), ({"min_p": 1.5}, "min_p"),
])
def test_bad_bodies_are_a_400_naming_the_field_and_queue_nothing(app_client, celery, body, param):
    response = complete(app_client, **body)
    error = response.get_json()["error"]
    assert response.status_code == 400 and error["param"] == param, error
    assert error["message"].startswith(param) and celery.sent == []


def test_suffix_without_fim_tokens_is_a_400_naming_it(make_app, plain_folder, celery):
    response = make_app(model=str(plain_folder)).test_client().post(
        "/v1/completions", json={"prompt": PROMPT, "suffix": "x"})
    error = response.get_json()["error"]
    assert response.status_code == 400 and error["param"] == "suffix" and "<|fim_prefix|>" in error["message"]
    assert celery.sent == []


# ---- the answer -------------------------------------------------------------------------------
def test_choices_echo_and_legacy_logprobs(app_client, store, celery, fim_folder):
    prompt_ids = ids_of(fim_folder, "Hello world")
    worker_answers(store, celery, [" one", " two", " three", " four"], fim_folder, n=2, prompt_ids=prompt_ids)
    body = complete(app_client, prompt=["Hello world", "Hello world"], n=2, echo=True, logprobs=1).get_json()
    assert body["object"] == "text_completion" and body["id"].startswith("cmpl-")
    assert [c["index"] for c in body["choices"]] == [0, 1, 2, 3]
    assert [c["text"] for c in body["choices"]] == ["Hello world one", "Hello world two",
                                                    "Hello world three", "Hello world four"]
    first = body["choices"][0]["logprobs"]
    answer_ids = ids_of(fim_folder, " one")
    assert len(first["tokens"]) == len(prompt_ids) + len(answer_ids)
    assert "".join(first["tokens"]) == "Hello world one"
    assert first["token_logprobs"][0] is None and first["top_logprobs"][0] is None
    assert first["token_logprobs"][1:len(prompt_ids)] == [-1.0] * (len(prompt_ids) - 1)
    text = body["choices"][0]["text"]
    assert all(text[offset:].startswith(token) for offset, token in zip(first["text_offset"], first["tokens"]))
    assert first["text_offset"][0] == 0 and first["text_offset"][len(prompt_ids)] == len("Hello world")
    top = first["top_logprobs"][len(prompt_ids)]
    assert set(top) >= {first["tokens"][len(prompt_ids)]} and len(top) <= 2
    assert body["usage"]["prompt_tokens"] == 8 and body["usage"]["completion_tokens"] == 12


def test_a_stream_carries_each_choices_text_and_logprobs(app_client, store, celery, fim_folder):
    worker_answers(store, celery, [" one two", " three"], fim_folder, n=2)
    response = complete(app_client, n=2, stream=True, logprobs=0, stream_options={"include_usage": True})
    assert response.mimetype == "text/event-stream"
    lines = data_lines(response.get_data())
    assert lines[-1] == "[DONE]"
    chunks = [json.loads(x) for x in lines[:-1]]
    assert all(c["object"] == "text_completion" for c in chunks)
    by_index: dict[int, list] = {0: [], 1: []}
    for chunk in chunks[:-1]:
        (choice,) = chunk["choices"]
        by_index[choice["index"]].append(choice)
    whole = complete(app_client, n=2, logprobs=0).get_json()
    for index, parts in by_index.items():
        assert "".join(p["text"] for p in parts) == whole["choices"][index]["text"]
        assert parts[-1]["finish_reason"] == "length" and all(p["finish_reason"] is None for p in parts[:-1])
        streamed = [p["logprobs"] for p in parts[:-1]]
        for key in ("tokens", "token_logprobs", "text_offset", "top_logprobs"):
            assert [v for lp in streamed for v in lp[key]] == whole["choices"][index]["logprobs"][key]
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 6


def test_an_echoed_stream_starts_each_choice_with_its_prompt(app_client, store, celery, fim_folder):
    worker_answers(store, celery, [" a", " b"], fim_folder)
    response = complete(app_client, prompt=["P1", "P2"], echo=True, stream=True)
    chunks = [json.loads(x) for x in data_lines(response.get_data())[:-1]]
    texts = {0: "", 1: ""}
    for chunk in chunks:
        texts[chunk["choices"][0]["index"]] += chunk["choices"][0]["text"]
    assert texts == {0: "P1 a", 1: "P2 b"}


# ---- n on chat ------------------------------------------------------------------------------------
def test_chat_n_is_one_job_with_a_choice_each(app_client, store, celery, fim_folder):
    worker_answers(store, celery, [" one", " two", " three"], fim_folder, n=3)
    messages = [{"role": "user", "content": "Count"}]
    response = app_client.post("/v1/chat/completions", json={"messages": messages, "n": 3, "seed": 1,
                                                              "logprobs": True})
    body = response.get_json()
    assert store.get(response.headers["X-Job-Id"]).request["n"] == 3 and len(celery.sent) == 1
    assert [c["message"]["content"] for c in body["choices"]] == [" one", " two", " three"]
    assert [c["index"] for c in body["choices"]] == [0, 1, 2]
    assert all(c["logprobs"]["content"] for c in body["choices"])
    stream = app_client.post("/v1/chat/completions", json={"messages": messages, "n": 3, "stream": True,
                                                            "logprobs": True})
    chunks = [json.loads(x) for x in data_lines(stream.get_data())[:-1]]
    content = {0: "", 1: "", 2: ""}
    for chunk in chunks:
        (choice,) = chunk["choices"]
        content[choice["index"]] += choice["delta"].get("content") or ""
        if choice["delta"].get("content"):
            assert choice["logprobs"]["content"]  # each piece carries its token's logprob
    assert content == {0: " one", 1: " two", 2: " three"}
    finishes = [c["choices"][0]["index"] for c in chunks if c["choices"][0]["finish_reason"]]
    assert finishes == [0, 1, 2]


# ---- the Batch API ---------------------------------------------------------------------------------
def test_a_batch_of_completions(app_client, store, celery, fim_folder):
    worker_answers(store, celery, [" done"], fim_folder)
    lines = [json.dumps({"custom_id": f"c{i}", "method": "POST", "url": "/v1/completions",
                         "body": {"prompt": f"Line {i}", "max_tokens": 4, "echo": True}}) for i in range(2)]
    lines.append(json.dumps({"custom_id": "bad", "method": "POST", "url": "/v1/completions",
                             "body": {"prompt": [1, 2]}}))
    file_id = app_client.post("/v1/files", data={"purpose": "batch", "file": (
        __import__("io").BytesIO("\n".join(lines).encode()), "in.jsonl")}).get_json()["id"]
    batch = app_client.post("/v1/batches", json={"input_file_id": file_id, "endpoint": "/v1/completions",
                                                 "completion_window": "24h"}).get_json()
    assert batch["endpoint"] == "/v1/completions", batch
    assert intake_done(app_client, batch["id"])["request_counts"]["total"] == 3
    for sent in list(celery.sent):
        celery.runner(sent["task_id"])
    done = app_client.get(f"/v1/batches/{batch['id']}").get_json()
    assert done["status"] == "completed" and done["request_counts"]["failed"] == 1
    output = [json.loads(x) for x in app_client.get(f"/v1/files/{done['output_file_id']}/content")
              .get_data(as_text=True).splitlines()]
    assert [o["response"]["body"]["choices"][0]["text"] for o in output] == ["Line 0 done", "Line 1 done"]
    assert all(o["response"]["body"]["object"] == "text_completion" for o in output)
    errors = app_client.get(f"/v1/files/{done['error_file_id']}/content").get_data(as_text=True)
    assert json.loads(errors)["response"]["body"]["error"]["param"] == "prompt"


def test_each_prompt_must_fit_the_context_on_its_own(app_client, store, celery, fim_folder):
    worker_answers(store, celery, [" a"] * 3, fim_folder)
    piece = "The quick brown fox jumps over the lazy dog. "
    per_prompt = len(ids_of(fim_folder, piece * 100))
    assert 3 * per_prompt > 4096 > per_prompt  # together they would not fit one context
    assert complete(app_client, prompt=[piece * 100] * 3).status_code == 200
    too_long = complete(app_client, prompt=["short", piece * 400]).get_json()["error"]
    assert too_long["param"] == "prompt" and too_long["code"] == "prompt_too_long"
