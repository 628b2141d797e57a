"""The shape of job events and job states, shared by workers (writers) and web (readers)."""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

# Job states.
QUEUED, RUNNING = "queued", "running"
SUCCEEDED, FAILED, CANCELLED, TIMEOUT = "succeeded", "failed", "cancelled", "timeout"
# A job still queued at its deadline ends ``expired`` without running (a running one that
# reaches it ends ``timeout``, with its partial result).
EXPIRED = "expired"
TERMINAL_STATES = (SUCCEEDED, FAILED, CANCELLED, TIMEOUT, EXPIRED)
ALL_STATES = (QUEUED, RUNNING, *TERMINAL_STATES)

# Event types. Exactly one terminal event (done | error | cancelled | timeout | expired) ends a job.
STATE, TOKEN, TOOL_STEP, STATS = "state", "token", "tool_step", "stats"
# A running job's request waits for the worker's engine loop ({"waiting": true}), then starts
# ({"waiting": false}); sent only when the wait is noticeable. Its time limit pauses meanwhile.
WAITING = "waiting"
DONE, ERROR = "done", "error"
TERMINAL_EVENT_FOR_STATE = {SUCCEEDED: DONE, FAILED: ERROR, CANCELLED: CANCELLED, TIMEOUT: TIMEOUT,
                            EXPIRED: EXPIRED}
TERMINAL_EVENTS = tuple(TERMINAL_EVENT_FOR_STATE.values())


@dataclass(frozen=True)
class Event:
    """One entry of a job's event stream. ``seq`` counts from 1 across all attempts."""

    seq: int
    type: str
    attempt: int
    ts: float
    data: dict[str, Any] = field(default_factory=dict)

    @property
    def is_terminal(self) -> bool:
        return self.type in TERMINAL_EVENTS

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), ensure_ascii=False)

    @classmethod
    def from_stream_fields(cls, fields: dict[str, str]) -> "Event":
        return cls(
            seq=int(fields["seq"]),
            type=fields["type"],
            attempt=int(fields["attempt"]),
            ts=float(fields["ts"]),
            data=json.loads(fields["data"]),
        )

# Error codes an agent job fails with when the *model's* output is unusable (the original
# API answered these with HTTP 422 and the trace). The worker puts the code in the job's
# error payload: {"code": ..., "message": ..., "trace": [...]}.
MALFORMED_TOOL_CALL, MAX_STEPS_EXCEEDED = "malformed_tool_call", "max_steps_exceeded"
AGENT_INPUT_ERRORS = (MALFORMED_TOOL_CALL, MAX_STEPS_EXCEEDED)
