"""Each model's own tokenizer in the web (fakeredis): with two models whose tokenizers and
contexts differ, ``/tokenize``, ``/detokenize``, the prompt-length check and ``logit_bias``
use the tokenizer of the request's model, as its worker published it (worker/model_text.py);
the web's own model falls back to its local folder until a worker publishes it."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from core import keys
from core import model_text as published
from core.workers import write_heartbeat
from tests.tiny_model import make_tiny_model_dir
from web.model_texts import ModelTexts
from worker.model_text import model_text

BETA_CONTEXT = 256


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("two-tokenizers")
    alpha = make_tiny_model_dir(root / "tiny-alpha", hidden_size=32, num_layers=1)
    beta = make_tiny_model_dir(root / "tiny-beta", hidden_size=32, num_layers=1, vocab_size=300,
                               config_extra={"max_position_embeddings": BETA_CONTEXT})
    return alpha, beta


@pytest.fixture(scope="module")
def hf(folders):
    from transformers import AutoConfig, AutoTokenizer

    return {f.name: SimpleNamespace(tokenizer=AutoTokenizer.from_pretrained(str(f)),
                                    model=SimpleNamespace(config=AutoConfig.from_pretrained(str(f))))
            for f in folders}


def serve(redis_client, loaded, model: str, worker: str) -> None:
    """What a worker of ``model`` does at start: heartbeat, and publish its model's text."""
    write_heartbeat(redis_client, worker, {"model_id": model, "queue": keys.worker_queue(worker)})
    assert published.publish(redis_client, model, model_text(loaded))


@pytest.fixture
def two_models(make_app, redis_client, folders, hf):
    alpha, beta = folders
    serve(redis_client, hf[alpha.name], alpha.name, "wa@h")
    serve(redis_client, hf[beta.name], beta.name, "wb@h")
    return make_app(model=str(alpha)).test_client()


TEXT = "Hello there, 你好, copy-on-write queues"


def test_the_two_tokenizers_differ(hf, folders):
    alpha, beta = (hf[f.name].tokenizer for f in folders)
    assert alpha.encode(TEXT) != beta.encode(TEXT)


def test_tokenize_uses_the_named_models_tokenizer(two_models, hf, folders):
    for folder in folders:
        body = two_models.post("/tokenize", json={"model": folder.name, "prompt": TEXT}).get_json()
        assert body["tokens"] == hf[folder.name].tokenizer.encode(TEXT)
        assert body["max_model_len"] == (BETA_CONTEXT if folder is folders[1] else 4096)
        back = two_models.post("/detokenize", json={"model": folder.name, "tokens": body["tokens"]}).get_json()
        assert back == {"prompt": TEXT}


def test_tokenize_messages_is_that_models_worker_prompt(two_models, hf, folders):
    from engine.prompt import build_prompt
    from engine.types import GenerationRequest

    messages = [{"role": "system", "content": "Be brief. 数学"}, {"role": "user", "content": TEXT}]
    beta = folders[1].name
    body = two_models.post("/tokenize", json={"model": beta, "messages": messages}).get_json()
    assert body["tokens"] == build_prompt(hf[beta].tokenizer, GenerationRequest(messages=messages)).ids


def test_the_prompt_length_check_uses_the_models_own_context(two_models, folders, hf, celery):
    alpha, beta = (f.name for f in folders)
    words = "queue " * 3  # with 230 new tokens: fits alpha's 4096, not beta's 256
    assert len(hf[beta].tokenizer.encode(words)) < BETA_CONTEXT - 230
    fits = two_models.post("/jobs", json={"prompt": words, "max_new_tokens": 230, "model": alpha})
    assert fits.status_code == 202, fits.get_json()
    refused = two_models.post("/jobs", json={"prompt": words, "max_new_tokens": 230, "model": beta})
    assert refused.status_code == 422
    error = refused.get_json()["error"]
    assert error["code"] == "context_exceeded" and str(BETA_CONTEXT) in error["message"]
    assert len(celery.sent) == 1


def test_logit_bias_keys_are_checked_against_the_models_vocabulary(two_models, hf, folders):
    alpha, beta = (f.name for f in folders)
    beyond_beta = len(hf[beta].tokenizer)  # a token id alpha has and beta does not
    assert beyond_beta < len(hf[alpha].tokenizer)
    body = {"prompt": "hi", "max_new_tokens": 2, "logit_bias": {str(beyond_beta): 1.0}}
    assert two_models.post("/jobs", json={**body, "model": alpha}).status_code == 202
    refused = two_models.post("/jobs", json={**body, "model": beta})
    assert refused.status_code == 422 and refused.get_json()["error"]["field"] == "logit_bias"


def test_a_model_whose_tokenizer_is_not_published_yet_is_a_503(make_app, redis_client, folders):
    write_heartbeat(redis_client, "wc@h", {"model_id": "tiny-gamma", "queue": keys.worker_queue("wc@h")})
    client = make_app(model=str(folders[0])).test_client()
    response = client.post("/tokenize", json={"model": "tiny-gamma", "prompt": "x"})
    assert response.status_code == 503 and response.get_json()["error"]["code"] == "tokenizer_unavailable"
    assert int(response.headers["Retry-After"]) > 0


def test_the_own_model_reads_its_folder_and_another_follows_its_workers(redis_client, folders, hf):
    alpha, beta = folders
    now = [0.0]
    texts = ModelTexts(redis_client, alpha.name, alpha, recheck_s=30, unknown_recheck_s=2, clock=lambda: now[0])
    assert published.publish(redis_client, alpha.name, model_text(hf[beta.name]))
    assert texts.get().source == "folder"  # the own model: the files its workers load, no Redis
    assert texts.get(beta.name) is None  # nothing published for beta yet
    assert published.publish(redis_client, beta.name, model_text(hf[alpha.name]))
    assert texts.get(beta.name) is None  # looked again after unknown_recheck_s only
    now[0] = 3.0
    assert texts.get(beta.name).vocab_size == len(hf[alpha.name].tokenizer)
    assert published.publish(redis_client, beta.name, model_text(hf[beta.name]))  # its workers changed
    now[0] = 20.0
    assert texts.get(beta.name).vocab_size == len(hf[alpha.name].tokenizer)  # cached until recheck_s
    now[0] = 34.0
    found = texts.get(beta.name)
    assert found.vocab_size == len(hf[beta.name].tokenizer) and found.context_length == BETA_CONTEXT
    assert not published.publish(redis_client, beta.name, model_text(hf[beta.name]))  # same digest: no rewrite


def test_the_published_tokenizer_counts_as_the_workers(hf, folders):
    from tokenizers import Tokenizer

    loaded = hf[folders[1].name]
    text = model_text(loaded)
    assert Tokenizer.from_str(text.tokenizer_json).encode(TEXT, add_special_tokens=False).ids == \
        loaded.tokenizer.encode(TEXT, add_special_tokens=False)
    assert text.chat_template == loaded.tokenizer.chat_template and text.context_length == BETA_CONTEXT
    assert text.special_tokens["eos_token"] == "<|im_end|>"


def test_the_webs_one_count_is_the_workers_prompt_length(hf, folders):
    """One render and one encoding in the web: its count is the worker's prompt length, and
    its system block the worker's cacheable prefix (the router's key), for both tokenizers."""
    from engine.prompt import build_prompt
    from engine.types import GenerationRequest, SamplingParams
    from tests.engine.test_prompt_once import SHAPES
    from web.model_texts import _from_published
    from web.prompt_text import count

    for folder in folders:
        loaded = hf[folder.name]
        web_model = _from_published(model_text(loaded))
        for shape in SHAPES:
            worker = build_prompt(loaded.tokenizer, GenerationRequest(sampling=SamplingParams(), **shape))
            counted = count(web_model, shape)
            assert counted.exact and counted.tokens == len(worker.ids), shape
            has_system = shape.get("prefix") is not None or shape["messages"][0]["role"] == "system"
            expected = worker.ids[:worker.prefix_len] if has_system and worker.prefix_len else None
            assert counted.system_ids == expected, shape
