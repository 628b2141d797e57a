"""Celery workers: ``celery -A worker worker -Q generation,agent,bench -E``.

Importing this package must stay light (no torch): the model is loaded lazily, once per
worker process, on the first job, never in the Celery parent before fork.
"""
from worker.app import app

__all__ = ["app"]
