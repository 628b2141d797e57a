"""A ``/v1/completions`` body as a ``completion`` job: the prompts as is (no chat template),
``n`` choices per prompt in the same job, and what the route needs to shape the answer.

Stored request (worker/requests.py reads it): ``{"messages": [], "prompts": [text, ...],
"n": k (when > 1), "sampling": {..., "logprobs", "top_logprobs", "prompt_logprobs"}, ...}``.
``suffix`` turns each prompt into a fill-in-the-middle prompt with the tokenizer's own FIM
tokens, ``<|fim_prefix|>PROMPT<|fim_suffix|>SUFFIX<|fim_middle|>`` (Qwen2.5-Coder's, also
StarCoder's spelling); a tokenizer without them is a 400 naming ``suffix``. ``echo`` with
``logprobs`` asks the worker for the prompt's own log-probabilities (engine.prompt_logprobs).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from web.context import ctx
from web.errors import ApiError
from web.models import model_of
from web.openai.completion_schemas import DEFAULT_MAX_TOKENS, MAX_TOTAL_CHOICES, CompletionRequest
from web.submit import Submission, job_method, job_sampling, with_speculative

FIM_PREFIX, FIM_SUFFIX, FIM_MIDDLE = "<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>"


@dataclass(frozen=True)
class CompletionJob:
    submission: Submission
    prompts: list[str]       # as the client sent them (echo shows these)
    n: int
    stream: bool
    include_usage: bool
    echo: bool
    logprobs: int | None     # the legacy integer: alternatives per token; None = no logprobs


def _bad(field_name: str, message: str) -> ApiError:
    return ApiError(400, "validation_error", f"{field_name}: {message}", field=field_name)


def has_fim_tokens(tokenizer: Any) -> bool:
    return tokenizer is not None and all(tokenizer.token_to_id(t) is not None for t in (FIM_PREFIX, FIM_SUFFIX, FIM_MIDDLE))


def fim_prompt(prompt: str, suffix: str, model: str | None = None) -> str:
    """The fill-in-the-middle prompt, when the served model's tokenizer has FIM tokens."""
    if not has_fim_tokens(ctx().budget.tokenizer(model_of(model))):
        raise _bad("suffix", f"not supported by this model: its tokenizer has no {FIM_PREFIX}, {FIM_SUFFIX}, "
                   f"{FIM_MIDDLE} tokens (fill-in-the-middle needs them)")
    return f"{FIM_PREFIX}{prompt}{FIM_SUFFIX}{suffix}{FIM_MIDDLE}"


def _prompts(body: CompletionRequest) -> list[str]:
    prompts = body.prompts
    if body.suffix is not None:
        if body.echo:
            raise _bad("echo", "not with suffix (the answer is the middle, not a continuation)")
        prompts = [fim_prompt(p, body.suffix, body.model or None) for p in prompts]
    for i, text in enumerate(prompts):
        if not text:
            raise _bad("prompt" if isinstance(body.prompt, str) else f"prompt.{i}", "must not be empty")
    return prompts


def _sampling(body: CompletionRequest) -> dict[str, Any]:
    out = job_sampling(body, body.max_tokens or DEFAULT_MAX_TOKENS, "max_tokens", body.model)
    if body.logprobs is not None:
        out.update(logprobs=True, top_logprobs=body.logprobs)
        if body.echo:
            if body.stream:  # the echo chunk goes first, and the prompt's scores come with the result
                raise _bad("echo", "with logprobs, not when streaming (the prompt's log-probabilities come "
                           "with the finished answer); ask without stream")
            out["prompt_logprobs"] = body.logprobs
    return out


def completion_job(body: CompletionRequest) -> CompletionJob:
    """Validate what the schema cannot (choices, FIM tokens, token cap) and build the job."""
    n = body.n or 1
    if n * len(body.prompts) > MAX_TOTAL_CHOICES:
        raise _bad("n", f"{len(body.prompts)} prompts x n = {n} is more than {MAX_TOTAL_CHOICES} choices")
    request: dict[str, Any] = {"messages": [], "prompts": _prompts(body), "prefix": None,
                               "sampling": _sampling(body),
                               "method": job_method(body),
                               "tools": None, "max_steps": None}
    if n > 1:
        request["n"] = n
    with_speculative(request, body.speculative, body.cache_salt, body.priority)
    include_usage = bool(body.stream_options and body.stream_options.include_usage)
    return CompletionJob(Submission("completion", request, "prompt", body.model or None), body.prompts, n,
                         bool(body.stream), include_usage, bool(body.echo), body.logprobs)
