"""The Celery app: clusterenv's settings (`celeryconfig` and what follows from them), a heartbeat
so the learner sees live workers, and what a worker does on SIGTERM (a spot VM's notice)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import threading
from typing import Any

from celery import Celery, bootsteps
from celery.signals import worker_process_init, worker_shutting_down

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
# (pipeline/chunks/runtime.py). Only a worker's main process gets the signal; a prefork worker
# forwards the notice to its children as NOTICE_SIGNAL, which sets their own copy of the event.
shutting_down = threading.Event()
# Celery's own handlers use SIGUSR1 (stack dump) in the main process and reset it in children;
# SIGUSR2 is free there unless CELERY_RDBSIG asks for the remote debugger.
NOTICE_SIGNAL = signal.SIGUSR2
_heartbeats: dict[str, WorkerHeartbeat] = {}  # this process's heartbeat step, by worker hostname


class WorkerHeartbeat(bootsteps.StartStopStep):
    """Announces this worker and its process count in the registry while it runs."""

    def __init__(self, worker, **kwargs):
        super().__init__(worker, **kwargs)
        self.registry: WorkerRegistry | None = None
        self.beat: Heartbeat | None = None
        self.pool: Any = None  # the worker's pool: a prefork pool's children get the notice
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
        self.pool = worker.pool
        _heartbeats[worker.hostname] = self

    def tell_children(self) -> None:
        """Forward the shutdown notice to a prefork pool's child processes (a solo pool has none:
        its one process is this one)."""
        for pid in self.pool.info.get("processes", []) if self.pool is not None else []:
            with contextlib.suppress(ProcessLookupError):  # a child that exited meanwhile
                os.kill(pid, NOTICE_SIGNAL)

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
        step.tell_children()
        step.leave(sender)


@worker_process_init.connect
def hear_the_notice(**_: Any) -> None:
    """In each prefork child: the main process forwards its shutdown notice as NOTICE_SIGNAL."""
    signal.signal(NOTICE_SIGNAL, lambda *_: shutting_down.set())
