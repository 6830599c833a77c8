"""The one way a process that only sends tasks gets a Celery app: the workers' settings, one broker."""

from __future__ import annotations

from celery import Celery

from clusterenv.pipeline.connect import celery_ssl


def celery_client(redis_url: str, name: str = "clusterenv-client") -> Celery:
    """A Celery app configured from `celeryconfig`, sending to `redis_url`; never the current app."""
    app = Celery(name, set_as_current=False)
    app.config_from_object("clusterenv.celeryconfig")
    app.conf.broker_url = redis_url
    app.conf.broker_use_ssl = celery_ssl(redis_url)
    return app
