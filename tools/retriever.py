"""``retrieve_note``: BM25 (bm25s) over the local notes in ``data/notes.json``.

BM25 only ranks; on its own it returns *something* for any query sharing one common
token. So a note is returned only when it covers most of the query: the IDF-weighted
share of the query's tokens found in the note must reach ``min_coverage`` (tokens the
corpus never saw count with the highest IDF, as they are the most specific words of the
query). An off-topic question therefore gets no notes instead of noise.

Hybrid ranking (an option): given an embedding function (``embed(texts) -> vectors``; tools
never import the engine, so the caller passes one in, e.g. the bundled embedding model run
in-process or a ``/v1/embeddings`` client), a note also qualifies when its vector's cosine
with the query's reaches ``min_similarity``, and the qualifying notes of both lists are
ordered by reciprocal rank fusion (``1 / (RRF_K + rank)`` summed over the two rankings,
as in Cormack et al., 2009). Note vectors are computed once, from the English title,
keywords and body (the bundled model reads English).
"""
from __future__ import annotations

import functools
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import bm25s

from tools.registry import Tool, ToolError
from tools.text import is_cjk, tokenize

NOTES_PATH = Path(__file__).resolve().parent.parent / "data" / "notes.json"
MAX_RESULTS = 3
MAX_QUERY_CHARS = 500
RRF_K = 60  # reciprocal rank fusion's constant: damps the weight of the very top ranks
EmbedFn = Callable[[list[str]], Sequence[Sequence[float]]]


@dataclass(frozen=True)
class Note:
    id: str
    title: str
    body_zh: str
    body_en: str
    keywords: tuple[str, ...] = ()

    def index_text(self) -> str:
        # Title and keywords twice: they name the topic, bodies also mention neighbours.
        head = " ".join([self.title, *self.keywords])
        return " ".join([head, head, self.body_zh, self.body_en])

    def embedding_text(self) -> str:
        return ". ".join([self.title, ", ".join(self.keywords), self.body_en])


@dataclass(frozen=True)
class Hit:
    title: str
    body: str
    score: float
    coverage: float

    def to_dict(self) -> dict[str, Any]:
        return {"title": self.title, "body": self.body, "score": round(self.score, 4)}


def load_notes(path: Path = NOTES_PATH) -> list[Note]:
    raw = json.loads(path.read_text(encoding="utf-8"))
    return [Note(n["id"], n["title"], n["body_zh"], n["body_en"], tuple(n.get("keywords", ())))
            for n in raw]


class NoteRetriever:
    """Ranks notes with BM25 and keeps only those that cover the query well enough."""

    def __init__(self, notes: list[Note], min_coverage: float = 0.5, min_relative_score: float = 0.4,
                 embed: EmbedFn | None = None, min_similarity: float = 0.35):
        if not notes:
            raise ValueError("no notes to index")
        self.notes = notes
        self.embed = embed
        self.min_similarity = min_similarity
        self._note_vectors = [_unit(v) for v in embed([n.embedding_text() for n in notes])] if embed else None
        self.min_coverage = min_coverage
        self.min_relative_score = min_relative_score
        doc_tokens = [tokenize(n.index_text()) for n in notes]
        self._doc_sets = [set(t) for t in doc_tokens]
        self._bm25 = bm25s.BM25()
        self._bm25.index(doc_tokens, show_progress=False)
        self._vocab = set(self._bm25.vocab_dict)
        n = len(notes)
        df: dict[str, int] = {}
        for s in self._doc_sets:
            for tok in s:
                df[tok] = df.get(tok, 0) + 1
        self._idf = {t: math.log(1 + (n - d + 0.5) / (d + 0.5)) for t, d in df.items()}
        self._unknown_idf = math.log(1 + (n - 0.5) / 1.5)  # as rare as a word in one note

    def search(self, query: str, top_k: int = MAX_RESULTS) -> list[Hit]:
        """BM25's qualifying notes, or with an embedding function the fused ranking."""
        limit = max(1, min(top_k, MAX_RESULTS))
        q_tokens = tokenize(query)
        if self._note_vectors is None:
            chosen = self.bm25_ranking(q_tokens, limit)
        else:
            lexical = [i for i, _ in self.bm25_ranking(q_tokens, MAX_RESULTS)]
            chosen = fuse([lexical, [i for i, _ in self.vector_ranking(query)]])[:limit]
        hits = []
        for i, score in chosen:
            note = self.notes[i]
            hits.append(Hit(note.title, note.body_zh if is_cjk(query) else note.body_en, score,
                            self.coverage(q_tokens, i)))
        return hits

    def bm25_ranking(self, q_tokens: list[str], limit: int) -> list[tuple[int, float]]:
        """(note, BM25 score) of the top ``limit`` notes that also cover the query, best first."""
        known = [t for t in q_tokens if t in self._vocab]
        if not known:
            return []
        scores = self._bm25.get_scores(known)
        order = sorted(range(len(self.notes)), key=lambda i: -float(scores[i]))
        best = float(scores[order[0]])
        return [(i, float(scores[i])) for i in order[:limit]
                if float(scores[i]) > 0 and float(scores[i]) >= self.min_relative_score * best
                and self.coverage(q_tokens, i) >= self.min_coverage]

    def vector_ranking(self, query: str) -> list[tuple[int, float]]:
        """(note, cosine) of the notes whose vector is near the query's, nearest first."""
        assert self.embed is not None and self._note_vectors is not None
        q = _unit(self.embed([query])[0])
        sims = [(i, sum(a * b for a, b in zip(q, v))) for i, v in enumerate(self._note_vectors)]
        return sorted([(i, s) for i, s in sims if s >= self.min_similarity], key=lambda pair: -pair[1])[:MAX_RESULTS]

    def coverage(self, q_tokens: list[str], doc_index: int) -> float:
        """IDF-weighted share of the query's distinct tokens that occur in the note."""
        distinct = set(q_tokens)
        weights = {t: self._idf.get(t, self._unknown_idf) for t in distinct}
        total = sum(weights.values())
        found = sum(w for t, w in weights.items() if t in self._doc_sets[doc_index])
        return found / total if total else 0.0


def fuse(rankings: list[list[int]], k: int = RRF_K) -> list[tuple[int, float]]:
    """Reciprocal rank fusion: (item, sum of 1 / (k + rank)) over the rankings, best first
    (ties: the order the items first appear in)."""
    scores: dict[int, float] = {}
    for ranking in rankings:
        for rank, item in enumerate(ranking, start=1):
            scores[item] = scores.get(item, 0.0) + 1.0 / (k + rank)
    return sorted(scores.items(), key=lambda pair: -pair[1])


def _unit(vector: Sequence[float]) -> list[float]:
    norm = math.sqrt(sum(float(x) * float(x) for x in vector)) or 1.0
    return [float(x) / norm for x in vector]


def parse_notes(content: str) -> list[dict[str, Any]]:
    """The notes in a ``retrieve_note`` result (empty when there are none or it is no result)."""
    try:
        return list(json.loads(content).get("notes", []))
    except (ValueError, AttributeError):
        return []


@functools.lru_cache(maxsize=1)
def default_retriever() -> NoteRetriever:
    """The shipped notes, indexed once per process (read-only afterwards, so shareable)."""
    return NoteRetriever(load_notes())


def retrieve_note_tool(retriever: NoteRetriever | None = None) -> Tool:
    retriever = retriever or default_retriever()

    def run(arguments: dict) -> str:
        query = arguments["query"]
        if len(query) > MAX_QUERY_CHARS:
            raise ToolError(f"query longer than {MAX_QUERY_CHARS} characters")
        hits = retriever.search(query, arguments.get("top_k", MAX_RESULTS))
        return json.dumps({"notes": [h.to_dict() for h in hits],
                           **({} if hits else {"message": "no relevant notes found"})},
                          ensure_ascii=False)

    return Tool(
        name="retrieve_note",
        description=("Search the local knowledge notes about LLM inference (Transformer, KV cache, "
                     "prefix cache, paged KV cache, RoPE, batching, attention, sampling, quantization) "
                     "and return the most relevant notes."),
        parameters={"type": "object",
                    "properties": {"query": {"type": "string", "minLength": 1,
                                             "description": "what to look up"},
                                   "top_k": {"type": "integer", "minimum": 1, "maximum": MAX_RESULTS}},
                    "required": ["query"]},
        executor=run,
    )
