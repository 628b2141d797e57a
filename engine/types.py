"""Plain data exchanged between the engine and its callers (worker, agent, benchmarks)."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Protocol

from core.grammar import Constraint
from core.sampling_fields import SamplingKnobs

# Finish reasons.
STOP, LENGTH, CANCELLED = "stop", "length", "cancelled"


@dataclass(frozen=True)
class SamplingParams(SamplingKnobs):
    """How to pick tokens: the knobs every surface shares (:class:`core.sampling_fields.SamplingKnobs`,
    declared there once) and what only the engine sees. ``temperature == 0`` means greedy;
    ``repetition_penalty=None`` means the model's own default (as ``generate`` would apply it)."""

    max_new_tokens: int = 128
    stop: tuple[str, ...] = ()
    logit_bias: tuple[tuple[int, float], ...] = ()   # (token id, -100..100) added to the logits
    logprobs: bool = False              # record per-token log-probabilities (engine.logprobs)
    top_logprobs: int = 0               # and this many alternatives per token (0..20)
    prompt_logprobs: int | None = None  # score the prompt's tokens too, this many alternatives each

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0


@dataclass(frozen=True)
class Resume:
    """What an earlier attempt of this request already streamed to its client: the generated
    ``ids`` whose text was all handed out, the ``text_chars`` the client holds (at least
    those ids' text; more when a stop string's possible start was held back mid-token), and
    the ``logprobs`` entries of those ids when the request records them. The run prefills
    the prompt plus ``ids`` and goes on from there (worker/resume.py), so the stream repeats
    and loses nothing, and the result is the whole answer."""

    ids: tuple[int, ...] = ()
    text_chars: int = 0
    logprobs: tuple[dict[str, Any], ...] = ()


@dataclass(frozen=True)
class GenerationRequest:
    """One generation: chat ``messages`` (OpenAI-style dicts), optional ``prefix`` (the
    system part, which ``prefix_cache`` keys on), optional OpenAI function-tool schemas
    rendered through the chat template, the method that runs it, and an optional
    ``constraint`` (a grammar, see :mod:`core.grammar`) every token must follow."""

    messages: list[dict[str, Any]]
    sampling: SamplingParams = field(default_factory=SamplingParams)
    method: str = "official"
    prefix: str | None = None
    tools: list[dict[str, Any]] | None = None
    speculative: bool | None = None  # None: MINISERVE_SPECULATIVE decides
    constraint: Constraint | None = None  # structured output: a grammar the answer must follow
    raw_prompt: str | None = None  # a text completion: this text as is, no chat template (messages unused)
    cache_salt: str = ""  # prefix-cache scope (the web's: the key's owner id, or a request's salt)
    priority: int = 1  # class rank (core/priorities.py): 0 interactive, 1 default, 2 batch
    resume: Resume | None = None  # continue after what an earlier attempt streamed (worker/resume.py)


@dataclass
class Usage:
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    draft_tokens: int = 0           # speculative drafts verified
    accepted_draft_tokens: int = 0  # of those, accepted (emitted without a forward of their own)


@dataclass
class Timings:
    """Seconds; ``decode_tokens_per_s`` counts tokens after the first over the decode time."""

    ttft_s: float = 0.0
    total_s: float = 0.0
    decode_tokens_per_s: float = 0.0


@dataclass
class GenerationResult:
    text: str
    finish_reason: str
    usage: Usage
    timings: Timings
    method: str
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[dict[str, Any]] | None = None  # one entry per token_ids entry, when asked
    prompt_logprobs: list[dict[str, Any]] | None = None  # one per prompt token (the first: logprob None)
    stop_sequence: str | None = None  # the request's stop string that ended the text (finish_reason stop)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


TextCallback = Callable[[str], None]
LogprobsCallback = Callable[[list[dict[str, Any]]], None]  # the entries of the tokens behind the next text
CancelCheck = Callable[[], bool]


class TextGenerator(Protocol):
    """What the worker and the agent need from an engine."""

    def generate(self, request: GenerationRequest, on_text: TextCallback | None = None,
                 should_cancel: CancelCheck | None = None) -> GenerationResult: ...
