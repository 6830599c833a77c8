"""The ingest thread: chunks from the stream into replay, and a note of each for the main thread.

Inserting from its own thread keeps the stream read and the replay copy off the gradient step's
path; the main thread learns of each accepted chunk (for dispatch and accounting) by an Arrival.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from learner.rate_limiter import RateLimiter
from learner.replay import ReplayBuffer
from pipeline.roles import TransitionReader


@dataclass
class Arrival:
    """What the ingest thread tells the main thread about one accepted chunk."""

    header: dict[str, Any]
    transitions: int
    lag_versions: int
    lag_updates: int


class Ingest:
    """Polls `reader` from a daemon thread; `lag_of(version)` gives (versions, updates) behind."""

    def __init__(
        self,
        reader: TransitionReader,
        replay: ReplayBuffer,
        limiter: RateLimiter,
        lag_of: Callable[[int], tuple[int, int]],
    ):
        self.reader, self.replay, self.limiter, self.lag_of = reader, replay, limiter, lag_of
        self.cpu_s = 0.0
        self._arrivals: queue.SimpleQueue[Arrival] = queue.SimpleQueue()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="ingest", daemon=True)

    def _sink(self, header: dict[str, Any], arrays: dict[str, np.ndarray]) -> None:
        a = arrays
        self.replay.add(a["obs"], a["action"], a["reward"], a["next_obs"], a["terminated"])
        rows = len(a["action"])
        self.limiter.on_insert(rows)
        lag_versions, lag_updates = self.lag_of(header["policy_version"])
        self._arrivals.put(Arrival(header, rows, lag_versions, lag_updates))

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                self.reader.poll(self._sink, block_ms=50)
        finally:
            self.cpu_s = time.thread_time()

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout_s: float = 5.0) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=timeout_s)

    def arrivals(self) -> Iterator[Arrival]:
        """The chunks accepted since the last call, in order of acceptance."""
        while True:
            try:
                yield self._arrivals.get_nowait()
            except queue.Empty:
                return
