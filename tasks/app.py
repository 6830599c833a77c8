"""The Celery app: clusterenv's settings (`celeryconfig` and what follows from them), a heartbeat
so the learner sees live workers, and what a worker does on SIGTERM (a spot VM's notice)."""

from __future__ import annotations

import json
import threading
from typing import Any

from celery import Celery, bootsteps
from celery.signals import worker_shutting_down

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


# Set when this worker begins to shut down (SIGTERM, SIGINT): the chunk in progress ends at its
# next step and is sent with what it has, and the task's later chunks are not collected
# (pipeline/chunks/runtime.py). In a prefork worker only the main process sees it: its children
# finish their chunks.
shutting_down = threading.Event()
_heartbeats: dict[str, WorkerHeartbeat] = {}  # this process's heartbeat step, by worker hostname


class WorkerHeartbeat(bootsteps.StartStopStep):
    """Announces this worker and its process count in the registry while it runs."""

    def __init__(self, worker, **kwargs):
        super().__init__(worker, **kwargs)
        self.registry: WorkerRegistry | None = None
        self.beat: Heartbeat | None = None
        self._lock = threading.RLock()  # the signal handler may run inside a leave() of its thread

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
        _heartbeats[worker.hostname] = self

    def leave(self, hostname: str) -> None:
        """Stop announcing, then withdraw the key (in that order: a beat in flight must not
        announce the worker again after the withdrawal); once."""
        with self._lock:
            beat, self.beat = self.beat, None
            if beat is None:
                return
            beat.stop()
            if self.registry is not None:
                self.registry.withdraw(hostname)

    def stop(self, worker):
        self.leave(worker.hostname)


app.steps["worker"].add(WorkerHeartbeat)


@worker_shutting_down.connect
def leave_at_once(sender: str | None = None, **_: Any) -> None:
    """A warm shutdown began (SIGTERM: a spot VM's notice, or SIGINT): leave the registry now,
    not when the task in progress is done, so the learner stops counting this worker and
    replaces at once what it will not finish (learner/run/lost_workers.py); the chunk in progress
    ends at its next step and is sent with what it has."""
    shutting_down.set()
    step = _heartbeats.get(sender or "")
    if step is not None:
        step.leave(sender)
