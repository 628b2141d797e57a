"""An OpenAI chat request as a MiniServe job: the same stored request shape ``web.submit``
writes for ``/jobs`` (so the worker runs a ``chat`` job unchanged), plus what the route
needs to shape the answer (tool set, streaming options).

Mapping: ``max_completion_tokens`` or ``max_tokens`` -> ``max_new_tokens``; ``temperature``
and ``top_p`` omitted -> greedy; ``developer`` -> ``system``; text parts are joined;
assistant ``tool_calls`` keep their arguments as objects (the chat template renders them);
``tool_choice: none`` -> the model does not see the tools; ``required`` or a named function
-> a closing system line asks for the call, and a grammar (``web.constraints``) makes the
answer exactly such calls; ``auto`` -> a lazy grammar that holds a call the model starts to
a valid call of a declared function. ``response_format`` / ``guided_choice`` /
``guided_regex`` -> their grammar (with tools, only when ``tool_choice`` is ``none``).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from pydantic import ValidationError

from web import constraints
from web.errors import ApiError, validation_details
from web.json_depth import InvalidText, JsonTooDeep, parse_json
from web.openai.schemas import ChatCompletionRequest, ChatMessage
from web.openai.tool_calls import ToolSet, compile_tools
from web.submit import Submission, job_method, job_sampling, with_speculative

REQUIRED_HINT = "Answer with a call to one of the functions you were given."
NAMED_HINT = "Answer with a call to the function `{name}`."


@dataclass(frozen=True)
class ChatJob:
    submission: Submission
    tools: ToolSet | None  # None: answers are plain content (no tools, or tool_choice none)
    stream: bool
    include_usage: bool
    forced_calls: bool = False  # required / named: the answer is calls only, streamed as deltas
    logprobs: bool = False      # the answer carries choices[].logprobs
    n: int = 1                  # choices (one job runs them all: worker/choices.py)


def _text(content: str | list[Any] | None) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    return "".join(part.text for part in content)


def _arguments(text: str, field_name: str) -> Any:
    """A tool call's ``arguments`` string as an object (the chat template renders objects);
    text that is not JSON stays text; JSON nested too deep is a 400, and JSON whose escapes
    make text that is not Unicode a 422, naming the field."""
    try:
        return parse_json(text)
    except JsonTooDeep as exc:
        raise ApiError(400, "json_too_deep", f"{field_name}: {exc}",
                       field=field_name) from None
    except InvalidText as exc:
        inside = f" (at {exc.field})" if exc.field else ""
        raise ApiError(422, "validation_error", f"{field_name}: {exc}{inside}", field=field_name) from None
    except ValueError:
        return text


def _message(message: ChatMessage, index: int) -> dict[str, Any]:
    out: dict[str, Any] = {"role": "system" if message.role == "developer" else message.role,
                           "content": _text(message.content)}
    if message.tool_calls:
        out["tool_calls"] = [{"id": call.id, "type": "function",
                              "function": {"name": call.function.name, "arguments": _arguments(
                                  call.function.arguments,
                                  f"messages[{index}].tool_calls[{n}].function.arguments")}}
                             for n, call in enumerate(message.tool_calls)]
    if message.tool_call_id is not None:
        out["tool_call_id"] = message.tool_call_id
    if message.name is not None:
        out["name"] = message.name
    return out


def stored_messages(messages: list[ChatMessage]) -> list[dict[str, Any]]:
    """Chat messages as the job stores them and the chat template reads them."""
    return [_message(m, i) for i, m in enumerate(messages)]


def _sampling(body: ChatCompletionRequest) -> dict[str, Any]:
    field_name = "max_completion_tokens" if body.max_completion_tokens else "max_tokens"
    out = job_sampling(body, body.max_completion_tokens or body.max_tokens, field_name, body.model)
    if body.logprobs:
        out.update(logprobs=True, top_logprobs=body.top_logprobs or 0)
    return out


def _tool_set(body: ChatCompletionRequest) -> ToolSet | None:
    choice = body.tool_choice
    if not body.tools:
        if choice not in (None, "none", "auto"):
            raise ApiError(422, "validation_error", "tool_choice: needs tools", field="tool_choice")
        return None
    if choice == "none":
        return None
    only = choice.function.name if not isinstance(choice, (str, type(None))) else None
    return compile_tools([t.model_dump() for t in body.tools], only=only,
                         parallel=body.parallel_tool_calls is not False)


def _hint(body: ChatCompletionRequest, tools: ToolSet | None) -> str | None:
    if tools is None:
        return None
    if tools.only is not None:
        return NAMED_HINT.format(name=tools.only)
    return REQUIRED_HINT if body.tool_choice == "required" else None


def _forced(body: ChatCompletionRequest, tools: ToolSet | None) -> bool:
    return tools is not None and (tools.only is not None or body.tool_choice == "required")


def _constraint(body: ChatCompletionRequest, tools: ToolSet | None) -> dict[str, Any] | None:
    """The grammar for the answer: the tools' (when the model may call them) or the
    structured-output fields' (at most one of the two)."""
    guided = constraints.for_request(body.format_dict(), body.guided_choice, body.guided_regex)
    if tools is None:
        return guided.to_dict() if guided is not None else None
    if guided is not None:
        name = {"choice": "guided_choice", "regex": "guided_regex"}.get(guided.kind, "response_format")
        raise ApiError(422, "validation_error", f"{name}: not with tools unless tool_choice is none", field=name)
    found = constraints.for_tools([t.model_dump() for t in body.tools or []], tools.only,
                                  required=_forced(body, tools), parallel=tools.parallel)
    return found.to_dict()


def chat_job(body: ChatCompletionRequest) -> ChatJob:
    """Validate what the schema cannot (token cap, tool schemas, grammars) and build the job request."""
    tools = _tool_set(body)
    constraint = _constraint(body, tools)
    messages = stored_messages(body.messages)
    hint = _hint(body, tools)
    if hint:
        messages.append({"role": "system", "content": hint})
    request = {"messages": messages, "prefix": None, "sampling": _sampling(body),
               "method": job_method(body),
               "tools": [t.model_dump(exclude_none=True) for t in body.tools] if tools else None,
               "max_steps": None}
    with_speculative(request, body.speculative, body.cache_salt, body.priority)
    if constraint is not None:
        request["constraint"] = constraint
    if (body.n or 1) > 1:
        request["n"] = body.n
    include_usage = bool(body.stream_options and body.stream_options.include_usage)
    return ChatJob(Submission("chat", request, "messages", body.model or None), tools, bool(body.stream),
                   include_usage, forced_calls=_forced(body, tools), logprobs=bool(body.logprobs), n=body.n or 1)


def chat_job_of(body: dict[str, Any], renamed: Callable[[str | None], str | None]) -> ChatJob:
    """Another protocol's request (``/v1/responses``, ``/v1/messages``) rewritten as a chat
    body: validated and built by :func:`chat_job` (one set of checks, grammars and job shape);
    its errors name the protocol's own fields, as ``renamed`` spells them."""
    try:
        return chat_job(ChatCompletionRequest.model_validate(body))
    except ValidationError as exc:
        first = validation_details(exc)[0]
        field = renamed(first["field"])
        raise ApiError(422, "validation_error", f"{field}: {first['message']}", field=field) from None
    except ApiError as exc:
        field = renamed(exc.field)
        message = exc.message.replace(exc.field, field, 1) if exc.field and field else exc.message
        raise ApiError(exc.status, exc.code, message, field=field, retry_after=exc.retry_after, extra=exc.extra,
                       job_id=exc.job_id, headers=exc.headers) from None
