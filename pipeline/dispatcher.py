"""Keeps enough `collect_chunk` tasks in flight for the workers that are alive, no more.

Workers are counted from their heartbeat keys, so a `celery worker` started on a new VM mid-run
gets chunks within a heartbeat. A chunk that has not arrived after `lost_after_s` is written off
(its worker probably died; Celery will redeliver it later, and the ledger accepts it once).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import redis
from celery import Celery

from pipeline.embedded import alive_worker_processes
from pipeline.protocol import ChunkRequest

TASK_NAME = "clusterenv.collect_chunk"


class Dispatcher:
    def __init__(
        self,
        app: Celery,
        client: redis.Redis,
        template: dict[str, Any],
        chunk_env_steps: int,
        per_process: int = 2,
        lost_after_s: float = 30.0,
    ):
        self.app, self.client, self.template = app, client, template
        self.chunk_env_steps = chunk_env_steps
        self.per_process = per_process
        self.lost_after_s = lost_after_s
        self.next_id = 0
        self.in_flight: dict[int, float] = {}
        self.lost = 0
        self._slots = 0
        self._slots_at = -1.0

    def slots(self) -> int:
        """Live worker processes on the broker (re-read at most every 0.5 s)."""
        now = time.monotonic()
        if now - self._slots_at > 0.5:
            self._slots = alive_worker_processes(self.client)
            self._slots_at = now
        return self._slots

    @property
    def pending_env_steps(self) -> int:
        return len(self.in_flight) * self.chunk_env_steps

    def top_up(self, epsilon: float, may_send: Callable[[int], bool]) -> int:
        """Send chunks until each live process has `per_process` or `may_send(pending)` says stop."""
        now = time.monotonic()
        for chunk_id, sent in list(self.in_flight.items()):
            if now - sent > self.lost_after_s:
                del self.in_flight[chunk_id]
                self.lost += 1
        target = self.per_process * self.slots()
        sent = 0
        while len(self.in_flight) < target and may_send(self.pending_env_steps):
            req = ChunkRequest(chunk_id=self.next_id, epsilon=round(epsilon, 6), **self.template)
            self.app.send_task(TASK_NAME, kwargs=req.to_json())
            self.in_flight[self.next_id] = now
            self.next_id += 1
            sent += 1
        return sent

    def arrived(self, chunk_id: int) -> None:
        self.in_flight.pop(chunk_id, None)
