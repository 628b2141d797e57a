"""The web's Celery *client*: it only sends tasks by name (``core.tasks``), never imports them."""
from __future__ import annotations

from celery import Celery

from core.redis_conn import celery_redis_options
from core.settings import Settings

# Give up publishing quickly when the broker is down, so the request gets a 503 in about
# a second instead of hanging (kombu raises OperationalError, see web.errors).
PUBLISH_RETRY_POLICY = {"max_retries": 2, "interval_start": 0, "interval_step": 0.3, "interval_max": 0.5}


def make_celery_client(settings: Settings) -> Celery:
    """No result backend on purpose: job results live in the job store (``core.jobs``), and a
    Redis result backend would subscribe to each task's result channel on ``send_task`` --
    with Redis down that retried for ~20 s and then raised a non-broker error."""
    client = Celery("miniserve-web", backend=None)
    client.conf.update(
        **celery_redis_options(settings, {"visibility_timeout": settings.visibility_timeout_s}, backend=False),
        broker_connection_timeout=2,
        broker_connection_retry_on_startup=False,
        task_publish_retry_policy=PUBLISH_RETRY_POLICY,
        task_serializer="json",
    )
    return client
