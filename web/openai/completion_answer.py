"""Shaping a finished (or streaming) ``completion`` job as OpenAI ``text_completion`` objects.

Legacy log-probabilities (``logprobs`` as an integer) are four parallel lists over the
tokens of the choice's text: ``tokens`` (each token's text), ``token_logprobs``,
``top_logprobs`` (the ``logprobs`` most likely alternatives and the chosen token, token text
-> logprob) and ``text_offset`` (where the token starts in the choice's text). With ``echo``
the prompt's tokens come first; the first has nothing before it, so its logprob and its
alternatives are ``null``, as vLLM reports them. :class:`LegacyLogprobs` builds them
piece by piece, so a stream's chunks and a whole answer agree.
"""
from __future__ import annotations

import codecs
import json
from typing import Any

from core.jobs import JobRecord
from web.context import ctx
from web.openai.choices import result_choices
from web.openai.completion_convert import CompletionJob
from web.openai.logprobs import token_bytes
from web.openai.responses import ChunkWriter, extension, usage


def completion_id(job_id: str) -> str:
    return f"cmpl-{job_id}"


class LegacyLogprobs:
    """One choice's legacy logprobs; :meth:`add` the engine's entries in order."""

    def __init__(self, start: int = 0) -> None:
        self.tokenizer = ctx().budget.tokenizer()
        self.start = start            # where the first added token starts in the choice's text
        # the text so far, decoded as the detokenizer decodes it (invalid bytes: one U+FFFD each run)
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._chars = 0

    def _text(self, token_id: int) -> tuple[str, bytes]:
        raw = bytes(token_bytes(self.tokenizer, token_id))
        return raw.decode("utf-8", errors="replace"), raw

    def add(self, entries: list[dict[str, Any]]) -> dict[str, Any]:
        out: dict[str, list[Any]] = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
        for entry in entries:
            text, raw = self._text(entry["token_id"])
            out["text_offset"].append(self.start + self._offset())
            self._chars += len(self._utf8.decode(raw))
            out["tokens"].append(text)
            out["token_logprobs"].append(entry["logprob"])
            out["top_logprobs"].append(self._top(entry, text))
        return out

    def _offset(self) -> int:
        """Characters of the text before the next token: those decoded, plus the bytes the
        decoder still holds (the start of a character, read as one U+FFFD until it is whole)."""
        pending, _ = self._utf8.getstate()
        return self._chars + len(pending.decode("utf-8", errors="replace"))

    def _top(self, entry: dict[str, Any], text: str) -> dict[str, float] | None:
        if entry["logprob"] is None:
            return None
        top = {self._text(i)[0]: lp for i, lp in entry.get("top") or []}
        top[text] = entry["logprob"]  # the chosen token wins a text two alternatives share (U+FFFD)
        return top


def _echoed(cjob: CompletionJob, choice: dict[str, Any]) -> str:
    return cjob.prompts[int(choice.get("prompt_index") or 0)] if cjob.echo else ""


def _finish(choice: dict[str, Any]) -> str:
    return "length" if choice.get("finish_reason") == "length" else "stop"


def choice_logprobs(cjob: CompletionJob, choice: dict[str, Any]) -> dict[str, Any] | None:
    """The whole choice's legacy logprobs (prompt tokens first with ``echo``)."""
    if cjob.logprobs is None:
        return None
    entries = list(choice.get("logprobs") or [])
    prompt = choice.get("prompt_logprobs") if cjob.echo else None
    head = LegacyLogprobs(0).add(prompt) if prompt else None
    tail = LegacyLogprobs(len(_echoed(cjob, choice))).add(entries)
    return {key: (head[key] if head else []) + tail[key] for key in tail}


def text_completion(job: JobRecord, cjob: CompletionJob, model: str) -> dict[str, Any]:
    result = job.result or {}
    choices = [{"index": c["index"], "text": _echoed(cjob, c) + str(c.get("text") or ""),
                "logprobs": choice_logprobs(cjob, c), "finish_reason": _finish(c)}
               for c in result_choices(result)]
    return {"id": completion_id(job.id), "object": "text_completion", "created": int(job.created_at),
            "model": model, "choices": choices, "usage": usage(result), "system_fingerprint": None,
            "miniserve": extension(job, result)}


class CompletionChunkWriter:
    """``text_completion`` chunks (``data: {...}``) for one streamed job, per choice."""

    def __init__(self, job: JobRecord, cjob: CompletionJob, model: str) -> None:
        self.job, self.cjob = job, cjob
        self.base = {"id": completion_id(job.id), "object": "text_completion", "created": int(job.created_at),
                     "model": model, "system_fingerprint": None}
        self._logprobs: dict[int, LegacyLogprobs] = {}

    def _event(self, payload: dict[str, Any]) -> str:
        if self.cjob.include_usage and "usage" not in payload:
            payload["usage"] = None
        return f"data: {json.dumps({**self.base, **payload}, ensure_ascii=False)}\n\n"

    def chunk(self, index: int, text: str, logprobs: dict[str, Any] | None = None, finish: str | None = None) -> str:
        return self._event({"choices": [{"index": index, "text": text, "logprobs": logprobs,
                                         "finish_reason": finish}]})

    def opening(self) -> list[str]:
        """With ``echo``, each choice starts with its prompt."""
        if not self.cjob.echo:
            return []
        n = self.cjob.n
        return [self.chunk(i, self.cjob.prompts[i // n]) for i in range(n * len(self.cjob.prompts))]

    def token(self, data: dict[str, Any]) -> list[str]:
        index = int(data.get("index", 0))
        logprobs = None
        if self.cjob.logprobs is not None:
            if index not in self._logprobs:
                start = len(self.cjob.prompts[index // self.cjob.n]) if self.cjob.echo else 0
                self._logprobs[index] = LegacyLogprobs(start)
            logprobs = self._logprobs[index].add(data.get("logprobs") or [])
        return [self.chunk(index, str(data.get("text") or ""), logprobs)]

    def ending(self, result: dict[str, Any], buffered: bool = False, streamed_calls: Any = False) -> list[str]:
        """Each choice's finish reason, then usage when asked (the chat writer's signature)."""
        out = [self.chunk(c["index"], "", None, _finish(c)) for c in result_choices(result)]
        if self.cjob.include_usage:
            out.append(self._event({"choices": [], "usage": usage(result)}))
        return out

    error = staticmethod(ChunkWriter.error)
    done = staticmethod(ChunkWriter.done)
