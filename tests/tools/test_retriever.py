import json

import pytest

from tools import create_default_registry
from tools.retriever import NoteRetriever, load_notes
from tools.text import tokenize

REQUIRED_TOPICS = ["Decoder-only Transformer", "KV Cache", "Prefix Cache", "Paged KV Cache", "RoPE",
                   "Continuous Batching", "Grouped-Query Attention", "Sampling"]


@pytest.fixture(scope="module")
def retriever() -> NoteRetriever:
    return NoteRetriever(load_notes())


def test_notes_cover_required_topics_in_both_languages():
    notes = load_notes()
    titles = " | ".join(n.title for n in notes)
    for topic in REQUIRED_TOPICS:
        assert topic in titles
    for note in notes:
        assert any("\u4e00" <= ch <= "\u9fff" for ch in note.body_zh)
        assert note.body_en.isascii()


def test_tokenizer_mixes_words_and_cjk_bigrams():
    tokens = tokenize("什么是 KV Cache 的内存")
    assert "kv" in tokens and "cach" in tokens
    assert "内存" in tokens and "内" in tokens
    assert "什么" not in tokens and "是" not in tokens


@pytest.mark.parametrize("query, title", [
    ("什么是 KV Cache？", "KV Cache"),
    ("What is a KV cache?", "KV Cache"),
    ("Paged KV Cache 如何减少内存浪费", "Paged KV Cache"),
    ("How does paged attention use a block table?", "Paged KV Cache"),
    ("How does RoPE encode positions?", "RoPE (Rotary Position Embedding)"),
    ("旋转位置编码", "RoPE (Rotary Position Embedding)"),
    ("连续批处理有什么好处", "Continuous Batching"),
    ("what is continuous batching", "Continuous Batching"),
    ("分组查询注意力", "Grouped-Query Attention (GQA)"),
    ("What is top-p sampling?", "Sampling: temperature, top-k, top-p"),
    ("temperature 参数的作用", "Sampling: temperature, top-k, top-p"),
    ("Prefix Cache 的 LRU 淘汰", "Prefix Cache"),
    ("decoder-only transformer", "Decoder-only Transformer"),
])
def test_relevant_note_ranks_first(retriever, query, title):
    hits = retriever.search(query)
    assert 1 <= len(hits) <= 3
    assert hits[0].title == title
    assert [h.score for h in hits] == sorted((h.score for h in hits), reverse=True)


@pytest.mark.parametrize("query", [
    "今天北京天气怎么样", "红烧肉怎么做", "写一首关于春天的诗", "What is the capital of France?",
    "How do I bake bread?", "Who won the 2018 World Cup?", "look up the recipe for mapo tofu in my notes",
])
def test_irrelevant_query_returns_nothing(retriever, query):
    assert retriever.search(query) == []


def test_body_language_follows_query(retriever):
    assert "缓存" in retriever.search("什么是 KV Cache")[0].body
    assert retriever.search("What is a KV cache?")[0].body.isascii()


def test_top_k_limits_results(retriever):
    assert len(retriever.search("KV cache memory", top_k=1)) == 1


def test_tool_output_is_json_with_title_body_score():
    registry = create_default_registry()
    found = json.loads(registry.execute("retrieve_note", {"query": "RoPE", "top_k": 2}).content)
    assert found["notes"] and set(found["notes"][0]) == {"title", "body", "score"}
    empty = json.loads(registry.execute("retrieve_note", {"query": "红烧肉怎么做"}).content)
    assert empty["notes"] == [] and "no relevant" in empty["message"]
    assert not registry.execute("retrieve_note", {"query": "x", "top_k": 9}).success
