"""Every Redis key and channel name MiniServe uses, in one place.

Nobody else spells a key: import the function from here. A job's keys are built only
from a :class:`JobId`, which only a validating constructor makes: an id from a client
(``/jobs/<id>:events``, ``/jobs/<id>/x``) can never name another job's stream or flag,
nor any key that is not a job's.
"""
from __future__ import annotations

import re

JOBS_INDEX = "jobs:index"  # sorted set: job id -> created_at
LEASES = "jobs:leases"  # sorted set: running job id -> lease deadline (unix seconds)
UNDISPATCHED = "jobs:undispatched"  # sorted set: queued job id -> when its task message was due
PENDING = "jobs:pending"  # sorted set: job id -> when its message was confirmed sent, until it starts
WORKERS_INDEX = "workers:index"  # sorted set: worker name -> last heartbeat
CANCELS = "jobs:cancels"  # pub/sub channel: the id of each job whose cancel flag was just raised
QUEUES = ("generation", "agent", "bench")  # Celery queue names (kombu keeps each as a Redis list)


_JOB_ID_SHAPE = re.compile(r"[0-9a-f]{32}")  # uuid4().hex, as core.jobs.new_job_id makes them


class InvalidJobId(ValueError):
    """Text that is not a job id's shape: no job can have it, and no key is built from it."""


class JobId(str):
    """A string known to be a job id's shape (32 lowercase hex digits).

    ``JobId(text)`` raises :class:`InvalidJobId` for anything else; a ``JobId`` passes
    through unchanged, so validating again costs one ``isinstance``."""

    __slots__ = ()

    def __new__(cls, text: object) -> "JobId":
        if isinstance(text, JobId):
            return text
        if not isinstance(text, str) or not _JOB_ID_SHAPE.fullmatch(text):
            raise InvalidJobId(f"not a job id: {str(text)[:80]!r}")
        return super().__new__(cls, text)


JOB_KEY_PREFIX = "job:"


def job_key(job_id: str) -> str:
    """Hash holding the job record."""
    return f"{JOB_KEY_PREFIX}{JobId(job_id)}"


def events_key(job_id: str) -> str:
    """Stream of the job's events; entry ids are ``0-<seq>`` so SSE ids and seq agree."""
    return f"job:{JobId(job_id)}:events"


def live_channel(job_id: str) -> str:
    """Pub/sub channel mirroring the event stream, live only (no replay)."""
    return f"job:{JobId(job_id)}:live"


def cancel_key(job_id: str) -> str:
    """Flag raised by a cancel; its worker hears of it on :data:`CANCELS` (worker/cancel_watch.py)."""
    return f"job:{JobId(job_id)}:cancel"


def idempotency_key(owner: str, key: str) -> str:
    """Maps a client's ``Idempotency-Key`` to the job it created."""
    return f"idem:{owner}:{key}"


def rate_key(owner: str, window: int) -> str:
    """Request counter for one client in one rate-limit window."""
    return f"rate:{owner}:{window}"


def streams_key(client: str) -> str:
    """Sorted set of one client's open SSE streams: stream token -> lease deadline."""
    return f"streams:{client}"


def worker_key(name: str) -> str:
    """Hash with a worker's self-description and cache statistics (expires without heartbeats)."""
    return f"worker:{name}"


# Kombu's Redis transport keeps every delivered, not yet acknowledged message here (its
# default names): ``unacked`` maps a delivery tag to [message, exchange, routing key],
# ``unacked_index`` scores each tag with its delivery time. Read by the sweeper.
KOMBU_UNACKED = "unacked"
KOMBU_UNACKED_INDEX = "unacked_index"


def queue_key(queue: str) -> str:
    """The Redis list kombu uses for a Celery queue (no priorities configured)."""
    return queue


# Metrics (web/metrics.py): totals folded in from finished jobs at scrape time.
METRICS_TOTALS = "metrics:totals"  # hash: "<family>|<labels...>" -> count or sum
METRICS_COUNTED_FIELD = "metrics_counted"  # field set on a job's hash once it is in the totals


# Cache-aware routing (core/routing.py).
ROUTING_QUEUES = "routing:queues"  # hash: a worker's own queue -> the worker (heartbeat name) consuming it
ROUTING_COUNTS = "routing:decisions"  # hash: decision -> count (for /metrics)
ROUTING_SERIES = "routing:series"  # list of recent cluster samples (JSON) for the monitor chart


ROUTING_HOMES = "routing:homes"  # hash: a worker's own queue -> its model's queue (where orphans go back)

# Several models per cluster (core/models.py).
MODELS_SEEN = "models:seen"  # hash: public model id -> last heartbeat of a worker serving it


def model_queue(base: str, model_id: str) -> str:
    """The queue of one model's jobs of one kind (``generation.<model id>``, ``agent.<model id>``),
    consumed by every worker that serves that model."""
    return f"{base}.{model_id}"


def model_text_key(model_id: str) -> str:
    """Hash: a served model's tokenizer.json, chat template and limits (core/model_text.py)."""
    return f"model:{model_id}:text"


def worker_queue(node: str) -> str:
    """The queue only the Celery node ``node`` (``name@host``) consumes."""
    return f"generation.{node}"


def prefix_holders_key(prefix_key: str) -> str:
    """Hash: worker name -> time it last ran a job with this prompt prefix."""
    return f"route:prefix:{prefix_key}"


# OpenAI's Batch API (core/batches.py): uploaded files and batches, with the job TTL.
FILES_INDEX = "files:index"  # sorted set: file id -> created_at
BATCHES_INDEX = "batches:index"  # sorted set: batch id -> created_at
_FILE_ID_SHAPE = re.compile(r"file-[0-9a-f]{32}")
_BATCH_ID_SHAPE = re.compile(r"batch_[0-9a-f]{32}")


def _checked(text: object, shape: re.Pattern[str], kind: str) -> str:
    """An id a client sent, checked before a key is built from it (as :class:`JobId` does)."""
    if not isinstance(text, str) or not shape.fullmatch(text):
        raise InvalidJobId(f"not a {kind} id: {str(text)[:80]!r}")
    return text


def file_key(file_id: str) -> str:
    """Hash: an uploaded (or a batch's output) file's metadata and its text."""
    return f"{FILE_KEY_PREFIX}{_checked(file_id, _FILE_ID_SHAPE, 'file')}"


FILE_KEY_PREFIX = "file:"  # the quota script checks which of an owner's files still exist


def file_owner_key(owner: str) -> str:
    """Hash: an owner's uploaded file ids -> "bytes:created_at" (their per-key quota)."""
    return f"files:owner:{owner or '-'}"


def batch_key(batch_id: str) -> str:
    """Hash: a batch's OpenAI object, its owner, and when its intake last made progress."""
    return f"batch:{_checked(batch_id, _BATCH_ID_SHAPE, 'batch')}"


def batch_entries_key(batch_id: str) -> str:
    """List: a batch's entries in input order, one JSON per line (its job or its error),
    appended chunk by chunk while the input is read."""
    return f"batch:{_checked(batch_id, _BATCH_ID_SHAPE, 'batch')}:entries"


# Deadlines (core/jobs.py): queued jobs the sweep ends ``expired`` once their deadline passed.
DEADLINES = "jobs:deadlines"  # sorted set: job id -> its deadline (unix seconds), until it ends

# Webhooks (core/webhooks.py). A job with a ``webhook_url`` enters the outbox in the same Lua
# step that ends it; the outbox score is when its next delivery try is due.
WEBHOOK_OUTBOX = "webhooks:outbox"  # sorted set: job id -> when its next try is due
WEBHOOKS_DEAD = "webhooks:dead"  # sorted set: job id -> when its last try failed (dead letters)


def webhook_key(job_id: str) -> str:
    """Hash: one job's webhook delivery (url, tries so far, last answer, state)."""
    return f"webhook:{JobId(job_id)}"


def webhook_try_key(job_id: str, try_id: str) -> str:
    """Marker (SET NX) that one delivery try has been made: never twice per try id."""
    return f"webhook:{JobId(job_id)}:try:{try_id}"


# A place in line (core/jobs.py): the queued jobs of each Celery queue in the order their
# messages were sent, which is the order a worker takes them (each queue is a FIFO list).
LINE_SEQ = "jobs:line_seq"  # counter: the order of sends, across queues


def line_key(queue: str) -> str:
    """Sorted set: the queue's waiting jobs -> their send order (ZRANK is a job's position)."""
    return f"line:{queue}"


# The fair gate (core/fair_gate.py): jobs that wait in Redis before their queue's Celery list.
HELD_QUEUES = "held:queues"  # set: queues that have held jobs
HELD_COUNTS = "held:counts"  # hash: queue -> its held jobs
QUEUED_BY_OWNER = "jobs:queued_by_owner"  # hash: owner id -> its jobs admitted and not yet started or ended


def held_prefix(queue: str) -> str:
    return f"held:{queue}:"


def held_owners_key(queue: str, priority: str) -> str:
    """List: the owners with jobs held in this queue and class, in the order of their turns."""
    return f"{held_prefix(queue)}{priority}:owners"


def held_key(queue: str, priority: str, owner: str) -> str:
    """List: one owner's held job ids in this queue and class, oldest first."""
    return f"{held_prefix(queue)}{priority}:owner:{owner}"


def held_key_parts(key: str) -> tuple[str, str, str]:
    """(queue, class, owner) of a :func:`held_key` (a queue name may hold ':'; a class not)."""
    prefix, _, owner = key.partition(":owner:")
    queue, _, priority = prefix[len("held:"):].rpartition(":")
    return queue, priority, owner


def line_starts_key(queue: str) -> str:
    """Sorted set: the queue's most recently started jobs -> start time (its service rate)."""
    return f"line:{queue}:starts"


def token_rate_key(owner: str, minute: int) -> str:
    """Tokens an API key was charged in one minute (core/token_rate.py; expires after two)."""
    return f"tpm:{owner}:{minute}"


TEST_STEP_GATE = "test:step-gate"  # string: while it exists a gated worker's loop runs only given steps (tests)


def step_gate_steps(gate_key: str) -> str:
    """List: one item per engine-loop turn a test allows (worker/step_gate.py)."""
    return f"{gate_key}:steps"
