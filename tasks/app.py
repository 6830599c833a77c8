"""The Celery app: clusterenv's settings (`celeryconfig` and what follows from them), plus a
heartbeat so the learner sees live workers."""

from __future__ import annotations

import json
from typing import Any

from celery import Celery, bootsteps

from clusterenv.pipeline.cluster.celery_client import configure
from clusterenv.pipeline.cluster.heartbeat import Heartbeat
from clusterenv.pipeline.cluster.registry import WorkerRegistry
from clusterenv.pipeline.connect import connect
from clusterenv.pipeline.keys import EVAL_QUEUE

app = Celery(
    "clusterenv",
    include=["clusterenv.tasks.collect", "clusterenv.tasks.evaluate", "clusterenv.tasks.env_shard"],
)
configure(app)


class JsonResult:
    """A task's small summary, whose repr is JSON.

    Celery puts repr(return value) into the task-succeeded event (what Flower shows as the
    result) and the worker log; a dict would read as a Python repr there. With results ignored
    (celeryconfig), nothing else of the value leaves the worker, so it is never serialized.
    """

    def __init__(self, summary: dict[str, Any]):
        self.summary = summary

    def __repr__(self) -> str:
        return json.dumps(self.summary, default=str)


class WorkerHeartbeat(bootsteps.StartStopStep):
    """Announces this worker and its process count in the registry while it runs."""

    def __init__(self, worker, **kwargs):
        super().__init__(worker, **kwargs)
        self.registry: WorkerRegistry | None = None
        self.beat: Heartbeat | None = None

    def start(self, worker):
        conf = worker.app.conf
        self.registry = WorkerRegistry(connect(conf.broker_url))
        # A solo pool runs one task at a time whatever `concurrency` says.
        solo = "solo" in getattr(worker.pool_cls, "__module__", "")
        processes = 1 if solo else int(worker.concurrency or 1)
        # `-Q clusterenv:eval` alone: this worker takes no chunks, so the learner sends none for it.
        eval_only = set(worker.app.amqp.queues.consume_from) == {EVAL_QUEUE}
        self.beat = self.registry.keep_alive(
            worker.hostname, processes, conf.clusterenv_heartbeat_every_s,
            conf.clusterenv_heartbeat_ttl_s, eval_only,
        )  # fmt: skip

    def stop(self, worker):
        if self.beat is not None:
            self.beat.stop()
        if self.registry is not None:
            self.registry.withdraw(worker.hostname)


app.steps["worker"].add(WorkerHeartbeat)
