"""Prompt length against the model's context, counted with the model folder's tokenizer.json
(or, without one, against MINISERVE_MAX_PROMPT_CHARS)."""
from __future__ import annotations

import json

import fakeredis
import pytest
from tokenizers import Tokenizer
from tokenizers.models import WordLevel
from tokenizers.pre_tokenizers import Whitespace

from core import keys
from core.model_source import DEFAULT_MODEL_NAME as DEFAULT_MODEL_FOLDER
from web.model_texts import ModelTexts
from web.prompt_budget import PromptBudget
from web.prompt_text import PER_MESSAGE_TOKENS, TEMPLATE_TOKENS

CONTEXT = 100


def _model_folder(folder):
    folder.mkdir(parents=True)
    tokenizer = Tokenizer(WordLevel({"[UNK]": 0, "w": 1}, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = Whitespace()
    tokenizer.save(str(folder / "tokenizer.json"))
    (folder / "config.json").write_text(json.dumps({"max_position_embeddings": CONTEXT}))
    return folder


def _words(n: int) -> str:
    return " ".join(["w"] * n)


@pytest.fixture
def local_model(tmp_path):
    return _model_folder(tmp_path / "tiny-model")


def test_counts_tokens_with_the_model_tokenizer(local_model):
    budget = PromptBudget(ModelTexts(fakeredis.FakeRedis(decode_responses=True), "tiny-model", local_model),
                          max_prompt_chars=10)
    assert budget.model() is not None and budget.context_length() == CONTEXT
    counted = budget.check({"messages": [{"role": "user", "content": _words(20)}]}, 5, "prompt")
    assert counted.tokens == 20 + PER_MESSAGE_TOKENS + TEMPLATE_TOKENS and not counted.exact  # no template


def test_too_long_prompt_is_422_naming_prompt_and_enqueues_nothing(make_app, local_model, celery, store):
    client = make_app(model=str(local_model)).test_client()
    response = client.post("/jobs", json={"prompt": _words(60), "max_new_tokens": 1})
    assert response.status_code == 422
    assert response.get_json()["error"] | {"message": ""} == {"code": "prompt_too_long", "field": "prompt",
                                                            "message": ""}
    assert celery.sent == [] and store.client.zcard(keys.JOBS_INDEX) == 0


def test_prompt_plus_new_tokens_over_context_names_max_new_tokens(make_app, local_model):
    client = make_app(model=str(local_model)).test_client()
    fits = 40 + PER_MESSAGE_TOKENS + TEMPLATE_TOKENS
    assert client.post("/jobs", json={"prompt": _words(40), "max_new_tokens": CONTEXT - fits}).status_code == 202
    response = client.post("/jobs", json={"prompt": _words(40), "max_new_tokens": CONTEXT - fits + 1})
    assert response.status_code == 422
    assert response.get_json()["error"]["field"] == "max_new_tokens"
    assert response.get_json()["error"]["code"] == "context_exceeded"


def test_messages_are_counted_together(make_app, local_model):
    client = make_app(model=str(local_model)).test_client()
    messages = [{"role": "user", "content": _words(15)} for _ in range(3)]  # 45 + 24 + 48 > 100
    response = client.post("/jobs", json={"messages": messages, "max_new_tokens": 1})
    assert response.status_code == 422 and response.get_json()["error"]["field"] == "messages"


def test_default_model_reads_the_prepared_cache_folder(make_app, tmp_path):
    _model_folder(tmp_path / "cache" / "models" / DEFAULT_MODEL_FOLDER)
    client = make_app().test_client()  # model 'default', cache_dir = tmp_path / "cache"
    assert client.post("/jobs", json={"prompt": _words(60), "max_new_tokens": 1}).status_code == 422


def test_without_a_tokenizer_falls_back_to_a_character_limit(make_app, celery):
    client = make_app(max_prompt_chars=50).test_client()
    assert client.post("/jobs", json={"prompt": "x" * 50}).status_code == 202
    response = client.post("/jobs", json={"prompt": "x" * 51})
    assert response.status_code == 422
    assert response.get_json()["error"]["code"] == "prompt_too_long"
    assert len(celery.sent) == 1


@pytest.mark.parametrize("path, body", [
    ("/jobs", {"type": "agent", "prompt": "-" * 101}),
    ("/agent/run", {"prompt": "-" * 101}),
])
def test_agent_prompt_has_a_character_limit_too(make_app, celery, store, path, body):
    """Long runs are few tokens, but the agent limit counts characters (issue 15)."""
    client = make_app(agent_max_prompt_chars=100, wait_timeout_s=1).test_client()
    response = client.post(path, json=body)
    assert response.status_code == 422, response.get_json()
    error = response.get_json()["error"]
    assert error["code"] == "prompt_too_long" and error["field"] == "prompt"
    assert "MINISERVE_AGENT_MAX_PROMPT_CHARS" in error["message"]
    assert celery.sent == [] and store.client.zcard(keys.JOBS_INDEX) == 0
    assert client.post(path, json={**body, "prompt": "-" * 100}).status_code in (200, 202, 504)
    assert client.post("/jobs", json={"prompt": "-" * 101}).status_code == 202  # generation: tokens only


def test_agent_character_limit_is_a_validated_setting():
    from core.settings import SettingsError, load_settings

    with pytest.raises(SettingsError, match="MINISERVE_AGENT_MAX_PROMPT_CHARS"):
        load_settings(agent_max_prompt_chars=0)


def test_the_kv_pool_caps_what_the_web_accepts_and_the_answer_names_it(make_app, local_model, celery):
    """A pool smaller than the model's context (here 20 blocks of 4 = 80 tokens < 100) is the
    limit: a request that could never fit the pool is refused up front, naming the pool."""
    prompt = _words(20)                                       # 20 + PER_MESSAGE + TEMPLATE = 76 tokens
    client = make_app(model=str(local_model), kv_num_blocks=20, kv_block_size=4).test_client()
    over = client.post("/jobs", json={"prompt": prompt, "max_new_tokens": 10})
    error = over.get_json()["error"]
    assert over.status_code == 422 and error["code"] == "context_exceeded" and "KV pool" in error["message"]
    assert "at most 4" in error["message"] and celery.sent == []
    fits = client.post("/jobs", json={"prompt": prompt, "max_new_tokens": 4})
    assert fits.status_code == 202, fits.get_json()
    sized_by_memory = make_app(model=str(local_model), kv_num_blocks=20, kv_block_size=4, kv_memory_mb=1)
    assert sized_by_memory.test_client().post("/jobs", json={"prompt": prompt, "max_new_tokens": 10}).status_code == 202
