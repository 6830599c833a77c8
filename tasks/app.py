"""The Celery app: settings from `celeryconfig`, plus a heartbeat so the learner sees live workers."""

from __future__ import annotations

import contextlib
import json
import logging

from celery import Celery, bootsteps

from pipeline.connect import connect
from pipeline.keys import worker_heartbeat

app = Celery("clusterenv", include=["tasks.collect", "tasks.env_shard"])
app.config_from_object("celeryconfig")

HEARTBEAT_EVERY_S = 2.0
HEARTBEAT_TTL_S = 6

log = logging.getLogger(__name__)


class Heartbeat(bootsteps.StartStopStep):
    """Keeps `clusterenv:worker:{hostname}` alive (value: JSON with the worker's process count)."""

    requires = {"celery.worker.components:Timer"}

    def __init__(self, worker, **kwargs):
        super().__init__(worker, **kwargs)
        self.tref = None
        self.client = None

    def start(self, worker):
        self.client = connect(worker.app.conf.broker_url)
        self.key = worker_heartbeat(worker.hostname)
        # A solo pool runs one task at a time whatever `concurrency` says.
        solo = "solo" in getattr(worker.pool_cls, "__module__", "")
        processes = 1 if solo else int(worker.concurrency or 1)
        self.value = json.dumps({"processes": processes})
        self.beat()
        self.tref = worker.timer.call_repeatedly(HEARTBEAT_EVERY_S, self.beat)

    def beat(self):
        try:
            self.client.set(self.key, self.value, ex=HEARTBEAT_TTL_S)
        except Exception as exc:  # a missed beat must never kill the worker
            log.warning("heartbeat failed: %s", exc)

    def stop(self, worker):
        if self.tref is not None:
            self.tref.cancel()
        if self.client is not None:
            with contextlib.suppress(Exception):  # the key expires by itself anyway
                self.client.delete(self.key)


app.steps["worker"].add(Heartbeat)
