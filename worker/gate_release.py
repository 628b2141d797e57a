"""Held jobs go out when a line moves (core/fair_gate.py): after each start and each end
here (an end frees a batch slot), and on each reaper tick for every queue with held jobs (a
safety net for a releaser that died)."""
from __future__ import annotations

import logging
from typing import Any

from core.fair_gate import FairGate, send_released
from core.jobs import JobStore
from core.logs import log_event

logger = logging.getLogger("miniserve.worker.gate")


def release(store: JobStore, celery_app: Any, settings: Any, queues: list[str] | None = None) -> int:
    """Send the held jobs whose turn came in ``queues`` (all queues with held jobs when None);
    returns how many. Best effort: what is not sent now is released by a later call."""
    gate = FairGate(store.client, settings.queue_window, settings.reserved_slots)
    sent = 0
    for queue in gate.held_queues() if queues is None else queues:
        try:
            sent += len(send_released(gate, store, celery_app, queue))
        except Exception as exc:  # noqa: BLE001 - held jobs stay held; released ones are swept
            log_event(logger, "gate_release_failed", level=logging.WARNING, queue=queue, error=type(exc).__name__)
    return sent
