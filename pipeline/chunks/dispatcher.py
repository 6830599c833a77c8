"""Keeps enough `collect_chunk` tasks in flight for the worker processes that are alive, no more.

A task carries `chunks_per_task` consecutive chunk ids: the worker runs them back to back, each
with its own stop and sync check and stream entry, so Celery's fixed cost per task (a few ms of
worker CPU) is paid once per task while staleness is still checked per chunk.

Workers are counted from their heartbeat keys, so a `celery worker` started on a new VM mid-run
gets chunks within a heartbeat. A chunk whose worker's heartbeat lapsed is written off at once
(learner/run/lost_workers.py); any other that has not arrived after `lost_after_s` is written off
then (should it arrive after all, the ledger accepts it once).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from clusterenv.pipeline.behaviour import Behaviour
from clusterenv.pipeline.chunks.request import COLLECT_CHUNK_TASK, ChunkRequest
from clusterenv.pipeline.roles import SendTask


@dataclass(frozen=True)
class DispatchConfig:
    tasks_per_process: int = 2
    """collect_chunk tasks kept in flight per live worker process (one running, one queued)"""
    chunks_per_task: int = 1
    """consecutive chunks one task collects (each with its own sync check and stream entry)"""
    lost_after_s: float = 30.0
    """seconds after which a chunk that has not arrived is written off and replaced"""
    slots_every_s: float = 0.5
    """how often the live worker processes are recounted from their heartbeats"""


class Dispatcher:
    """Sends ChunkRequests built from `template` (all fields but chunk ids and behaviour) through
    `send`."""

    def __init__(
        self,
        send: SendTask,
        alive_processes: Callable[[], int],
        template: dict[str, Any],
        chunk_env_steps: int,
        config: DispatchConfig = DispatchConfig(),
        clock: Callable[[], float] = time.monotonic,
    ):
        self.send, self.alive_processes, self.template = send, alive_processes, template
        self.chunk_env_steps, self.config, self.clock = chunk_env_steps, config, clock
        self.next_id = 0
        self.in_flight: dict[int, float] = {}
        self.lost = 0
        self.late = 0  # chunks that arrived after they had been written off
        self._slots = 0
        self._slots_at = -float("inf")

    def slots(self) -> int:
        """Live worker processes on the broker (recounted at most every `slots_every_s`)."""
        now = self.clock()
        if now - self._slots_at > self.config.slots_every_s:
            self._slots = self.alive_processes()
            self._slots_at = now
        return self._slots

    @property
    def pending_env_steps(self) -> int:
        return len(self.in_flight) * self.chunk_env_steps

    @property
    def task_env_steps(self) -> int:
        """Env steps one task collects."""
        return self.config.chunks_per_task * self.chunk_env_steps

    def top_up(self, behaviour: Behaviour, may_send: Callable[[int], bool]) -> int:
        """Send tasks, whose workers act as `behaviour` says, until each live process has its
        share or `may_send(pending)` says stop; returns the chunks sent."""
        now = self.clock()
        for chunk_id, sent in list(self.in_flight.items()):
            if now - sent > self.config.lost_after_s:
                del self.in_flight[chunk_id]
                self.lost += 1
        per_task = self.config.chunks_per_task
        target = self.config.tasks_per_process * per_task * self.slots()
        sent = 0
        while len(self.in_flight) + per_task <= target and may_send(self.pending_env_steps):
            req = ChunkRequest(
                chunk_id=self.next_id, chunks=per_task, behaviour=behaviour, **self.template
            )
            self.send(COLLECT_CHUNK_TASK, req.to_json())
            for chunk_id in req.chunk_ids():
                self.in_flight[chunk_id] = now
            self.next_id += per_task
            sent += per_task
        return sent

    def write_off_in_flight(self) -> int:
        """Count every chunk in flight as lost now (the broker lost its queue); how many."""
        return self.write_off(list(self.in_flight))

    def write_off(self, chunk_ids: list[int]) -> int:
        """Count these chunks, those of them still in flight, as lost now (their worker is
        gone); how many were."""
        gone = [c for c in chunk_ids if self.in_flight.pop(c, None) is not None]
        self.lost += len(gone)
        return len(gone)

    def arrived(self, chunk_id: int) -> None:
        if self.in_flight.pop(chunk_id, None) is None and chunk_id < self.next_id:
            self.late += 1

    def save(self) -> tuple[dict[str, Any], dict[str, int]]:
        """The next chunk id and the chunks lost so far (a checkpoint's; chunks in flight belong
        to this learner's run id and are not carried over)."""
        return {}, {"next_chunk": self.next_id, "lost": self.lost}

    def restore(self, arrays: Mapping[str, Any], values: Mapping[str, int]) -> None:
        self.next_id, self.lost = values["next_chunk"], values["lost"]
