"""The Celery application and the queue settings DESIGN.md asks for."""
from __future__ import annotations

from celery import Celery
from celery.signals import celeryd_after_setup
from kombu import Exchange, Queue

from core import keys
from core.model_source import EMBEDDING, model_id, model_kind
from core.models import EMBEDDING_QUEUE, SHARED_QUEUES
from core.tasks import WEBHOOK_QUEUE
from core.redis_conn import celery_redis_options
from core.settings import Settings, get_settings


def celery_config(settings: Settings) -> dict:
    """Late acks + prefetch 1 so a job is never lost with its worker; visibility timeout above
    the hard time limit so a long job is not re-delivered while it still runs."""
    return {
        # broker_url, result_backend and their transport options (Sentinel: master_name).
        **celery_redis_options(settings, {"visibility_timeout": settings.visibility_timeout_s}),
        "broker_connection_retry_on_startup": True,
        # A lost broker (Redis restart) is retried forever, every 2..30 s: Celery's default
        # gives up after 100 tries and the worker would exit during a long outage.
        "broker_connection_retry": True,
        "broker_connection_max_retries": None,
        "result_expires": settings.job_ttl_s,
        "task_acks_late": True,
        "task_reject_on_worker_lost": True,
        "worker_prefetch_multiplier": 1,
        "worker_pool": settings.worker_pool,
        "worker_concurrency": settings.worker_concurrency,
        # The job runner's own deadline (polled between tokens) ends a job at the soft limit
        # with its partial result; Celery's soft limit is only a backstop for a stuck step.
        "task_soft_time_limit": (settings.soft_time_limit_s + settings.hard_time_limit_s) / 2,
        "task_time_limit": settings.hard_time_limit_s,
        "task_queues": [Queue(name, Exchange(name, type="direct"), routing_key=name) for name in keys.QUEUES],
        "task_default_queue": "generation",
        "worker_send_task_events": True,
        "task_send_sent_event": True,
        "task_track_started": True,
        "worker_hijack_root_logger": False,
        "worker_cancel_long_running_tasks_on_connection_loss": False,
        "imports": ("worker.tasks", "worker.bench_tasks", "worker.agent_eval_tasks", "worker.batch_tasks",
                    "worker.webhook_tasks", "worker.embed_tasks", "worker.signals"),
    }


def create_celery_app(settings: Settings | None = None) -> Celery:
    settings = settings or get_settings()
    celery_app = Celery("miniserve")
    config = celery_config(settings)
    config.setdefault("result_backend_transport_options", {})["retry_policy"] = {"timeout": 5.0}
    celery_app.conf.update(config)
    return celery_app


app = create_celery_app()


@celeryd_after_setup.connect
def _consume_own_queue(sender: str, instance, **_: object) -> None:
    """Each worker also consumes a queue of its own, so the web can route a job to the worker
    that holds its prompt's prefix (core/routing.py), and its model's queues
    (``generation.<model id>``, ``agent.<model id>``: core/models.py), and the ``webhooks``
    queue (core/webhooks.py), whatever ``-Q`` says.
    An embedding model's worker consumes ``embedding.<model id>`` and nothing else: it drops
    the shared queues (``generation``, ``agent``, ``bench``: Celery's default ``-Q`` is
    ``generation``), whose jobs need a chat model."""
    queues = instance.app.amqp.queues
    queues.select_add(WEBHOOK_QUEUE)
    settings = get_settings()
    if model_kind(settings.model) == EMBEDDING:
        for queue in keys.QUEUES:
            queues.deselect(queue)
    else:
        queues.select_add(keys.worker_queue(sender))
    for queue in model_queues_of(settings):
        queues.select_add(queue)


def model_queues_of(settings: Settings) -> list[str]:
    """The queues of the model this worker serves (``MINISERVE_MODEL``)."""
    if model_kind(settings.model) == EMBEDDING:
        return [keys.model_queue(EMBEDDING_QUEUE, model_id(settings.model))]
    return [keys.model_queue(base, model_id(settings.model)) for base in SHARED_QUEUES]

