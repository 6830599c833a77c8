"""Celery apps with the workers' settings: the worker app's set-up (tasks/app.py) and the one way a
process that only sends tasks gets an app for a broker."""

from __future__ import annotations

from typing import Any

from celery import Celery
from kombu import Queue

from clusterenv.pipeline.connect import celery_ssl
from clusterenv.pipeline.evaluation.request import EVALUATE_TASK
from clusterenv.pipeline.keys import COLLECT_QUEUE, EVAL_QUEUE


def configure(app: Celery) -> None:
    """`app` takes clusterenv's settings: celeryconfig's (literals and the environment), and, once
    Celery has loaded them, the ones that follow from clusterenv's own names and the final broker
    URL (`_derived_settings`)."""
    app.config_from_object("clusterenv.celeryconfig")
    app.on_after_configure.connect(_derived_settings)


def _derived_settings(sender: Celery, **_: Any) -> None:
    """TLS verified for a rediss:// broker (pipeline/connect.py); collection on Celery's default
    queue, evaluation on its own (a worker without -Q takes both)."""
    sender.conf.update(
        broker_use_ssl=celery_ssl(sender.conf.broker_url),
        task_default_queue=COLLECT_QUEUE,
        task_queues=(Queue(COLLECT_QUEUE), Queue(EVAL_QUEUE)),
        task_routes={EVALUATE_TASK: {"queue": EVAL_QUEUE}},
    )


def celery_client(redis_url: str, name: str = "clusterenv-client") -> Celery:
    """A Celery app with the workers' settings, sending to `redis_url`; never the current app."""
    app = Celery(name, set_as_current=False)
    configure(app)
    app.conf.broker_url = redis_url
    return app
