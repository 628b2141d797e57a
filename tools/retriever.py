"""``retrieve_note``: BM25 (bm25s) over the local notes in ``data/notes.json``.

BM25 only ranks; on its own it returns *something* for any query sharing one common
token. So a note is returned only when it covers most of the query: the IDF-weighted
share of the query's tokens found in the note must reach ``min_coverage`` (tokens the
corpus never saw count with the highest IDF, as they are the most specific words of the
query). An off-topic question therefore gets no notes instead of noise.
"""
from __future__ import annotations

import functools
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import bm25s

from tools.registry import Tool, ToolError
from tools.text import is_cjk, tokenize

NOTES_PATH = Path(__file__).resolve().parent.parent / "data" / "notes.json"
MAX_RESULTS = 3
MAX_QUERY_CHARS = 500


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

    def __init__(self, notes: list[Note], min_coverage: float = 0.5, min_relative_score: float = 0.4):
        if not notes:
            raise ValueError("no notes to index")
        self.notes = notes
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
        q_tokens = tokenize(query)
        known = [t for t in q_tokens if t in self._vocab]
        if not known:
            return []
        scores = self._bm25.get_scores(known)
        order = sorted(range(len(self.notes)), key=lambda i: -float(scores[i]))
        best = float(scores[order[0]])
        hits: list[Hit] = []
        for i in order[: max(1, min(top_k, MAX_RESULTS))]:
            score, coverage = float(scores[i]), self.coverage(q_tokens, i)
            if score <= 0 or coverage < self.min_coverage or score < self.min_relative_score * best:
                continue
            note = self.notes[i]
            hits.append(Hit(note.title, note.body_zh if is_cjk(query) else note.body_en, score, coverage))
        return hits

    def coverage(self, q_tokens: list[str], doc_index: int) -> float:
        """IDF-weighted share of the query's distinct tokens that occur in the note."""
        distinct = set(q_tokens)
        weights = {t: self._idf.get(t, self._unknown_idf) for t in distinct}
        total = sum(weights.values())
        found = sum(w for t, w in weights.items() if t in self._doc_sets[doc_index])
        return found / total if total else 0.0


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
