"""Celery task names and their queues: the contract between web (sends by name) and worker."""
from __future__ import annotations

GENERATE = "miniserve.generate"
AGENT = "miniserve.agent"
BENCH = "miniserve.bench"
EMBED = "miniserve.embed"  # embedding jobs: always on their model's queue ``embedding.<model id>``

QUEUE_FOR_JOB_TYPE = {"generate": "generation", "chat": "generation", "completion": "generation", "agent": "agent",
                      "bench": "bench", "embedding": "embedding"}
TASK_FOR_JOB_TYPE = {"generate": GENERATE, "chat": GENERATE, "completion": GENERATE, "agent": AGENT,
                     "bench": BENCH, "embedding": EMBED}

WEBHOOK = "miniserve.webhook"  # one delivery try of a finished job's webhook (core/webhooks.py)
WEBHOOK_QUEUE = "webhooks"  # its own queue, so deliveries never wait behind generation jobs' messages
