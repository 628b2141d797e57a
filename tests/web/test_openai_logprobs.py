"""``logit_bias`` keys are token ids of the served tokenizer (/v1 and /jobs), and ``logprobs`` name tokens by
their exact bytes (a byte-level token may hold part of a character)."""
from __future__ import annotations

import pytest

from tests.tiny_model import make_tiny_model_dir
from web.openai.logprobs import token_bytes
from web.tokenizer import load_tokenizer

USER = [{"role": "user", "content": "Hello"}]


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory):
    return make_tiny_model_dir(tmp_path_factory.mktemp("tiny-logprobs"), hidden_size=32, num_layers=1)


def test_a_bias_key_outside_the_vocabulary_is_a_400_naming_logit_bias(make_app, tiny_folder):
    client = make_app(model=str(tiny_folder)).test_client()
    vocab = load_tokenizer(tiny_folder).get_vocab_size(with_added_tokens=True)
    response = client.post("/v1/chat/completions", json={"messages": USER, "logit_bias": {str(vocab): 5}})
    error = response.get_json()["error"]
    assert response.status_code == 400 and error["param"] == "logit_bias"
    assert f"0..{vocab - 1}" in error["message"]


def test_token_bytes_rebuild_the_text_exactly(tiny_folder):
    tokenizer = load_tokenizer(tiny_folder)
    text = "naïve 你好 😀 <|im_end|>"
    ids = tokenizer.encode(text, add_special_tokens=False).ids
    joined = b"".join(bytes(token_bytes(tokenizer, i)) for i in ids)
    assert joined.decode("utf-8") == tokenizer.decode(ids, skip_special_tokens=False) == text


def test_jobs_carry_openai_penalties_and_bias(make_app, store, tiny_folder):
    client = make_app(model=str(tiny_folder)).test_client()
    response = client.post("/jobs", json={"prompt": "hi", "presence_penalty": 1.5, "frequency_penalty": -0.5,
                                          "logit_bias": {"3": -100, "4": 2}})
    assert response.status_code == 202, response.get_json()
    sampling = store.get(response.get_json()["id"]).request["sampling"]
    assert (sampling["presence_penalty"], sampling["frequency_penalty"]) == (1.5, -0.5)
    assert sampling["logit_bias"] == [[3, -100.0], [4, 2.0]]
    plain = client.post("/jobs", json={"prompt": "hi"}).get_json()["id"]
    assert "logit_bias" not in store.get(plain).request["sampling"]  # nothing stored unless asked


@pytest.mark.parametrize("body", [{"presence_penalty": 2.1}, {"frequency_penalty": -3}, {"logit_bias": {"3": 200}},
                                  {"logit_bias": {"999999": 1}}, {"logit_bias": {"a": 1}}])
def test_jobs_refuse_bad_penalties_and_bias_naming_the_field(make_app, tiny_folder, body):
    client = make_app(model=str(tiny_folder)).test_client()
    response = client.post("/jobs", json={"prompt": "hi", **body})
    assert response.status_code == 422, response.get_json()
    assert next(iter(body)) in response.get_data(as_text=True)
