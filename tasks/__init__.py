"""Celery app and worker tasks; `celery -A tasks worker` finds `tasks.app` here."""

from tasks.app import app

__all__ = ["app"]
