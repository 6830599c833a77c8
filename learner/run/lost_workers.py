"""A dead worker costs the survivors nothing: its chunks leave the dispatch quota as soon as its
heartbeat lapses, not after --lost-after-s.

Workers note each chunk they take (pipeline/chunks/takers.py). While a dead worker's heartbeat
is still alive the live worker count includes it, so the dispatcher keeps the same number of
tasks in flight and every survivor that returns a chunk gets another. When the count drops, the
chunks in flight that a worker no longer alive took are written off at once, and dispatch sends
their replacements to the survivors in the same turn.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from clusterenv.pipeline.chunks.dispatcher import Dispatcher
from clusterenv.pipeline.roles import ChunkTakers, WorkerDirectory

log = logging.getLogger(__name__)


class LostWorkers:
    """Looks whenever the live process count has dropped since the last look, and at least every
    `every_s` (a death hidden by a worker joining at the same time)."""

    def __init__(
        self,
        takers: ChunkTakers,
        workers: WorkerDirectory,
        dispatcher: Dispatcher,
        every_s: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.takers, self.workers, self.dispatcher = takers, workers, dispatcher
        self.every_s, self.clock = every_s, clock
        self._slots, self._looked_at = 0, clock()
        self._arrived: list[int] = []  # whose takers the next look forgets
        self.written_off = 0

    def arrived(self, chunk_id: int) -> None:
        self._arrived.append(chunk_id)

    def check(self) -> int:
        """Write off the chunks in flight whose taker is gone; how many."""
        slots, now = self.dispatcher.slots(), self.clock()
        dropped, self._slots = slots < self._slots, slots
        if not dropped and now - self._looked_at < self.every_s:
            return 0
        self._looked_at = now
        taken = self.takers.takers(sorted(self.dispatcher.in_flight))
        alive = {host: self.workers.is_alive(host) for host in set(taken.values())}
        dead = sorted(c for c, host in taken.items() if not alive[host])
        count = self.dispatcher.write_off(dead)
        if count:
            self.written_off += count
            gone = ", ".join(sorted(h for h, up in alive.items() if not up))
            log.warning("worker %s gone: %d chunks in flight written off and replaced", gone, count)
        forget, self._arrived = self._arrived + dead, []
        self.takers.forget(forget)
        return count
