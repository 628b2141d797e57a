"""Tell Celery how a job ended, so Flower and ``celery result`` show the truth.

The job store stays the record (one terminal event per attempt, written by the job runner);
this module only mirrors the job's terminal state into the task's Celery state once the
delivery is over:

====================  =============================================================
job state             Celery state of the task (the task id is the job id)
====================  =============================================================
``succeeded``         SUCCESS, result ``{"job_id", "state", "usage"}`` (not the text)
``failed``            FAILURE, exception ``JobError(code)``
``timeout``           FAILURE, exception ``JobTimedOut(code)`` (its own type)
``cancelled``         REVOKED (reason ``cancelled``), and a ``task-revoked`` event
``expired``           left as it is: the job never ran (its deadline passed while queued);
                      the delivery is acknowledged and ignored
still running         left as it is (a stale or duplicate delivery of a job that another
                      attempt runs): the delivery is acknowledged and ignored
====================  =============================================================

The exceptions carry only the job's error code, never its message (which may quote the
request), and are the tasks' expected ``throws``: Celery logs them on one INFO line, sends
no retry (no task has ``autoretry_for``) and acks the message (``task_acks_on_failure_or_timeout``
is left at its default, true), so a failed job is never run again behind the job's back.
"""
from __future__ import annotations

from typing import Any

from celery import Task
from celery.exceptions import Ignore

from core.events import CANCELLED, FAILED, SUCCEEDED, TIMEOUT
from core.jobs import JobRecord, JobStore


class JobError(Exception):
    """The job ended ``failed``; the message is its error code."""


class JobTimedOut(JobError):
    """The job ended ``timeout`` (its time limit), a failure of its own type."""


TASK_THROWS = (JobError, JobTimedOut)


def report_outcome(task: Task, store: JobStore, job_id: str, ended: Any = None) -> dict[str, Any]:
    """Return (SUCCESS) or raise (FAILURE, REVOKED, ignored) as the job ended.
    ``ended`` (:class:`worker.job_runner.Ended`): the ending this delivery wrote itself, so
    the job is not read back; without it (skipped, forwarded, lost a race) the store says."""
    state, payload = (ended.state, ended.payload) if ended is not None else _stored(store.get(job_id))
    if state == SUCCEEDED:
        return {"job_id": job_id, "state": SUCCEEDED, "usage": (payload or {}).get("usage")}
    if state == FAILED:
        raise JobError(_code(payload, "failed"))
    if state == TIMEOUT:
        raise JobTimedOut(_code(payload, "timeout"))
    if state == CANCELLED:
        _revoke(task, job_id)
    raise Ignore()


def _stored(record: JobRecord) -> tuple[str, dict[str, Any] | None]:
    return record.state, record.result if record.state == SUCCEEDED else record.error


def _code(payload: dict[str, Any] | None, default: str) -> str:
    return str((payload or {}).get("code") or default)


def _revoke(task: Task, job_id: str) -> None:
    """REVOKED in the result backend (``celery result``) and for event monitors (Flower)."""
    task.backend.mark_as_revoked(job_id, reason=CANCELLED, request=task.request)
    task.send_event("task-revoked", terminated=False, signum=None, expired=False)
