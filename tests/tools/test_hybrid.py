"""Hybrid note retrieval: BM25 and an embedding function passed in, fused by reciprocal rank.
The embedding function here is a fake (a vector per topic word), so the test is about the
fusion and the gates, not about a model."""
from __future__ import annotations

import json

from tools.retriever import RRF_K, NoteRetriever, fuse, load_notes, retrieve_note_tool

TOPICS = {"kv cache": ("recompute", "keys and values"), "speculative decoding": ("draft model", "guess ahead"),
          "repetition penalty": ("same words again",)}


def fake_embed(texts):
    """One axis per topic: a text lies on a topic's axis when its first sentence (a note's
    title, a whole query) names the topic or one of its rewordings; other texts are zero."""
    vectors = []
    for text in texts:
        head = text.lower().split(". ")[0]
        vectors.append([1.0 if topic in head or any(s in head for s in words) else 0.0
                        for topic, words in TOPICS.items()])
    return vectors


def test_fuse_sums_reciprocal_ranks():
    fused = fuse([[1, 2, 3], [3, 1]])
    assert [item for item, _ in fused] == [1, 3, 2]
    assert fused[0][1] == 1 / (RRF_K + 1) + 1 / (RRF_K + 2)


def test_hybrid_finds_a_note_bm25_misses():
    notes = load_notes()
    query = "Why would a server want to avoid the need to recompute keys and values?"
    assert NoteRetriever(notes).search(query) == []
    hits = NoteRetriever(notes, embed=fake_embed, min_similarity=0.5).search(query)
    assert [h.title for h in hits][:1] == ["KV Cache"]


def test_both_rankings_agreeing_keep_bm25s_answer_first():
    notes = load_notes()
    bm25 = NoteRetriever(notes).search("What is speculative decoding with a draft model?")
    hybrid = NoteRetriever(notes, embed=fake_embed).search("What is speculative decoding with a draft model?")
    assert bm25[0].title == hybrid[0].title == "Speculative Decoding"


def test_an_off_topic_query_still_gets_no_notes():
    retriever = NoteRetriever(load_notes(), embed=fake_embed, min_similarity=0.5)
    assert retriever.search("the recipe of mapo tofu") == []


def test_the_tool_runs_a_hybrid_retriever():
    tool = retrieve_note_tool(NoteRetriever(load_notes(), embed=fake_embed, min_similarity=0.5))
    result = json.loads(tool.executor({"query": "guess ahead with a draft model, then verify"}))
    assert result["notes"][0]["title"] == "Speculative Decoding"
