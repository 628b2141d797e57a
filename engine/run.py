"""Bookkeeping shared by every generation method: one :class:`GenerationRun` per request.

A method produces token ids; the run turns each into streamed text, decides when to stop
(end-of-sequence id, stop string, max tokens, cancellation) and assembles the
:class:`~engine.types.GenerationResult` with usage and timings. Keeping this in one place is
what makes the methods comparable token for token and second for second.

Pausing: a method that runs as a solo task on the engine loop (:mod:`engine.solo`) gets a
``pause`` hook; :meth:`GenerationRun.accept` calls it after each token that does not end the
run, so every method yields the loop between two tokens at this one place. Cancellation
and the deadline are read again when it resumes.

Log-probabilities, when asked, travel with the text: before each piece, ``on_logprobs``
gets the entries of the tokens that piece completes (:attr:`TextStream.covered`), and the
last call (at :meth:`GenerationRun.result`) brings the rest, so a stream carries exactly the
result's entries, each with the text of its token.

Counting: ``token_ids`` are the generated tokens without a final end-of-sequence id;
``usage.completion_tokens`` counts every token the model produced, that id included.

Resuming (:meth:`GenerationRun.resume`): a request that continues an earlier attempt's
answer starts with that answer's ids already taken (their text is not handed out again);
``produced`` and ``max_new_tokens`` count this attempt's tokens, so every method and the
scheduler's block budget stay as they are, and the result counts the whole answer.
"""
from __future__ import annotations

import time
from typing import Any, Callable, Iterable

from engine.textstream import TextStream
from engine.types import (CANCELLED, LENGTH, STOP, CancelCheck, GenerationResult, LogprobsCallback, Resume,
                          TextCallback, Timings, Usage)


class GenerationRun:
    def __init__(self, tokenizer: Any, *, method: str, max_new_tokens: int,
                 eos_ids: Iterable[int], stops: Iterable[str] = (), min_tokens: int = 0,
                 on_text: TextCallback | None = None, should_cancel: CancelCheck | None = None,
                 started: float | None = None, logprobs: bool = False,
                 on_logprobs: LogprobsCallback | None = None) -> None:
        self.method = method
        self.logprobs: list[dict[str, Any]] | None = [] if logprobs else None  # filled by the sampler
        self.prompt_logprobs: list[dict[str, Any]] | None = None  # set by the loop when asked
        self._on_logprobs = on_logprobs if logprobs else None
        self._logprobs_sent = 0
        self.tokenizer = tokenizer      # speculative drafting reads its vocabulary
        self.max_new_tokens = max_new_tokens
        self.eos_ids = frozenset(int(i) for i in eos_ids)
        self._stream = TextStream(tokenizer, tuple(stops), min_tokens)  # no stop string ends it before min_tokens
        self._on_text = on_text
        self._should_cancel = should_cancel
        self.started = time.perf_counter() if started is None else started
        self.first_token_at: float | None = None
        self.last_token_at: float | None = None
        self.token_ids: list[int] = []
        self.produced = 0     # tokens this attempt produced
        self.resumed = 0      # tokens an earlier attempt produced and streamed (resume)
        self.finish_reason: str | None = None
        self.draft_tokens = self.accepted_draft_tokens = 0
        self.pause: Callable[[], None] | None = None  # set by the loop for a solo task
        self.prefill_allowance: Callable[[int], int] | None = None  # set by the loop: this turn's prompt budget
        self.constraint: Any = None  # the request's grammar state, compiled once by the loop at submit
        self._outbox: list[tuple[Any, Any, int, int]] | None = None  # held hand-outs (defer_output)
        self.shown: tuple[int, int] | None = None  # (generated, covered) as of the piece being handed out

    def resume(self, resume: Resume) -> None:
        """Start after an earlier attempt's streamed tokens: they count as generated (and,
        with log-probabilities, bring their entries); only what follows is streamed."""
        ids = [int(i) for i in resume.ids]
        self._stream.prime(ids, resume.text_chars)
        self.token_ids = list(ids)
        self.resumed = len(ids)
        self.max_new_tokens -= len(ids)
        if self.logprobs is not None:
            self.logprobs.extend(resume.logprobs)
            self._logprobs_sent = len(self.logprobs)

    @property
    def generated(self) -> int:
        """Tokens of the whole answer so far (an earlier attempt's included)."""
        return self.resumed + self.produced

    @property
    def covered(self) -> int:
        """Leading generated tokens whose text has all been handed out."""
        return min(self._stream.covered, len(self.token_ids))

    @property
    def done(self) -> bool:
        return self.finish_reason is not None

    def cancelled(self) -> bool:
        """Check the caller's cancel flag (between tokens); marks the run cancelled if set."""
        if self.finish_reason is None and self._should_cancel is not None and self._should_cancel():
            self.finish_reason = CANCELLED
        return self.finish_reason == CANCELLED

    def accept(self, token_id: int) -> bool:
        """Take one generated token; return True when generation must stop after it."""
        if self.done:
            return True
        now = time.perf_counter()
        if self.first_token_at is None:
            self.first_token_at = now
        self.last_token_at = now
        self.produced += 1
        token_id = int(token_id)
        if token_id in self.eos_ids:
            self.finish_reason = STOP
            return True
        self.token_ids.append(token_id)
        piece, hit_stop = self._stream.push(token_id)
        self._emit(piece)
        if hit_stop:
            self.finish_reason = STOP
        elif self.produced >= self.max_new_tokens:
            self.finish_reason = LENGTH
        elif self.pause is not None:
            self.pause()  # the loop's other work runs here; we come back on our next turn
        if not self.done and self._should_cancel is not None and self._should_cancel():
            self.finish_reason = CANCELLED
        return self.done

    def record_drafts(self, drafted: int, accepted: int) -> None:
        """Speculative decoding's counts for this request (reported in ``usage``)."""
        self.draft_tokens += drafted
        self.accepted_draft_tokens += accepted

    def defer_output(self) -> None:
        """Hold text and log-probabilities until :meth:`hand_out` (the paged scheduler's runs:
        its step returns, then the loop hands out what each sequence produced)."""
        self._outbox = []

    def hand_out(self) -> None:
        """Pass on what was held, in order, each piece with the counts as of its token
        (``shown``, which a consumer reads instead of the run's latest)."""
        box, self._outbox = self._outbox or [], []
        for callback, value, generated, covered in box:
            self.shown = (generated, covered)
            callback(value)
        self.shown = None

    def _emit(self, piece: str, upto: int | None = None) -> None:
        """``piece`` to ``on_text``, after the log-probabilities of the tokens it completes."""
        if self._on_logprobs is not None and self.logprobs is not None:
            end = min(self._stream.covered if upto is None else upto, len(self.logprobs), len(self.token_ids))
            if end > self._logprobs_sent:
                entries, self._logprobs_sent = self.logprobs[self._logprobs_sent:end], end
                self._pass(self._on_logprobs, entries)
        if piece and self._on_text is not None:
            self._pass(self._on_text, piece)

    def _pass(self, callback: Callable[[Any], None], value: Any) -> None:
        if self._outbox is None:
            callback(value)
        else:
            self._outbox.append((callback, value, self.generated, self.covered))

    def result(self, prompt_tokens: int, cached_tokens: int = 0) -> GenerationResult:
        """Flush held-back text and build the result (call once, at the end)."""
        self._emit(self._stream.finish(), upto=len(self.token_ids))
        if self._outbox is not None:
            self.hand_out()
        if self.finish_reason is None:
            self.finish_reason = LENGTH
        end = time.perf_counter()
        ttft = (self.first_token_at - self.started) if self.first_token_at else 0.0
        decode_tps = 0.0
        if self.produced > 1 and self.last_token_at and self.first_token_at:
            span = self.last_token_at - self.first_token_at
            decode_tps = (self.produced - 1) / span if span > 0 else 0.0
        prompt_tokens -= self.resumed  # the resumed ids were prefilled, but they are the answer's
        if self.prompt_logprobs is not None:
            self.prompt_logprobs = self.prompt_logprobs[:prompt_tokens]
        return GenerationResult(
            text=self._stream.text, finish_reason=self.finish_reason,
            usage=Usage(prompt_tokens=prompt_tokens, completion_tokens=self.generated,
                        cached_tokens=min(cached_tokens, prompt_tokens), draft_tokens=self.draft_tokens,
                        accepted_draft_tokens=self.accepted_draft_tokens),
            timings=Timings(ttft_s=ttft, total_s=end - self.started, decode_tokens_per_s=decode_tps),
            method=self.method, token_ids=list(self.token_ids), logprobs=self._token_logprobs(),
            prompt_logprobs=self.prompt_logprobs,
            stop_sequence=self._stream.stop_string if self.finish_reason == STOP else None)

    def _token_logprobs(self) -> list[dict[str, Any]] | None:
        """The sampler's entries for the tokens kept (not a final end-of-sequence id, nor
        speculative tokens scored past a stop)."""
        return None if self.logprobs is None else self.logprobs[:len(self.token_ids)]
