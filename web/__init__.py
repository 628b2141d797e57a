"""The MiniServe front end: Flask + flask-openapi3, talking to Redis and sending Celery tasks
by name. Never imports torch or ``engine``."""
from web.app import create_app

__all__ = ["create_app"]
