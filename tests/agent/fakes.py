"""A scripted chat model: returns prepared outputs in order and records what it was sent."""
from __future__ import annotations

import copy
from typing import Any


class ScriptedModel:
    def __init__(self, outputs: list[str]):
        self.outputs = list(outputs)
        self.requests: list[dict[str, Any]] = []

    def chat(self, messages, tools, max_new_tokens) -> str:
        self.requests.append({"messages": copy.deepcopy(messages), "tools": tools,
                              "max_new_tokens": max_new_tokens})
        if not self.outputs:
            raise AssertionError("the agent asked the model more often than scripted")
        return self.outputs.pop(0)


def call(name: str, **arguments) -> str:
    import json
    return json.dumps({"name": name, "arguments": arguments}, ensure_ascii=False)
