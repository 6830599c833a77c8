"""The ingest thread: chunks from the stream into the learner, and a note of each for the main thread.

The learner's `insert` stores a chunk (DQN: into replay; PPO: onto its queue of chunks).
Inserting from its own thread keeps the stream read and the copy off the gradient step's
path; the main thread learns of each accepted chunk (for dispatch and accounting) by an Arrival.
Every `claim_every_s` the thread also takes over chunks that a reader took but never acked for
`stale_after_s`: the dispatcher's write-off time (--lost-after-s), given by the trainer.
A failed read is retried with backoff (`retries` times in a row, doubling from `backoff_s` up to
`backoff_cap_s`: about 12 s); a connection the Redis client's own retries could not restore
(about 30 s of them) is not retried again. Then the thread ends and keeps the error in `error`,
for the main thread to stop the run with: never a silent stall.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from clusterenv.pipeline.connect import broker_gone
from clusterenv.pipeline.roles import TransitionReader

log = logging.getLogger(__name__)


@dataclass
class Arrival:
    """What the ingest thread tells the main thread about one accepted chunk."""

    header: dict[str, Any]
    transitions: int
    lag_versions: int
    lag_updates: int


class Ingest:
    """Polls `reader` from a daemon thread into `store` (the learner's `insert`: a chunk's header
    and arrays in, its rows stored out); `lag_of(version)` gives (versions, updates) behind;
    chunks a reader took and never acked are claimed once `stale_after_s` idle."""

    def __init__(
        self,
        reader: TransitionReader,
        store: Callable[[dict[str, Any], dict[str, np.ndarray]], int],
        lag_of: Callable[[int], tuple[int, int]],
        stale_after_s: float,
        claim_every_s: float = 10.0,
        retries: int = 6,
        backoff_s: float = 0.25,
        backoff_cap_s: float = 4.0,
    ):
        self.reader, self.store, self.lag_of = reader, store, lag_of
        self.stale_after_s, self.claim_every_s = stale_after_s, claim_every_s
        self.retries, self.backoff_s, self.backoff_cap_s = retries, backoff_s, backoff_cap_s
        self.retried = 0  # failed reads that were retried, over the whole run
        self.cpu_s = 0.0
        self.error: BaseException | None = None
        self._arrivals: queue.SimpleQueue[Arrival] = queue.SimpleQueue()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="ingest", daemon=True)

    def _sink(self, header: dict[str, Any], arrays: dict[str, np.ndarray]) -> None:
        if not arrays:  # an env fault before the chunk's first transition: a header alone
            self._arrivals.put(Arrival(header, 0, 0, 0))
            return
        rows = self.store(header, arrays)
        lag_versions, lag_updates = self.lag_of(header["policy_version"])
        self._arrivals.put(Arrival(header, rows, lag_versions, lag_updates))

    def _run(self) -> None:
        claimed_at, failures = time.monotonic(), 0
        while not self._stop.is_set():
            try:
                self.reader.poll(self._sink, block_ms=50)
                if time.monotonic() - claimed_at > self.claim_every_s:
                    self.reader.claim_stale(self._sink, round(self.stale_after_s * 1000))
                    claimed_at = time.monotonic()
                failures = 0
            except Exception as exc:
                failures += 1
                # A connection the client's own retries could not restore is not retried again.
                if broker_gone(exc) or failures > self.retries:
                    log.error("ingest stopped: %s: %s", type(exc).__name__, exc)
                    self.error = exc  # the main thread reports it and stops the run
                    break
                delay = min(self.backoff_cap_s, self.backoff_s * 2 ** (failures - 1))
                log.warning("ingest failed (%s: %s); retry %d of %d in %.2f s",
                            type(exc).__name__, exc, failures, self.retries, delay)  # fmt: skip
                self.retried += 1
                self._stop.wait(delay)
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

    def save(self) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        """The reader's counts (chunks, transitions, duplicates, rejections by reason)."""
        stats = self.reader.stats
        return {}, {**vars(stats), "rejected_reasons": dict(stats.rejected_reasons)}

    def restore(self, arrays: Mapping[str, np.ndarray], values: Mapping[str, Any]) -> None:
        vars(self.reader.stats).update(values)
