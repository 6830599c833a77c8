"""Samples-per-insert rate limiting, as Reverb's SampleToInsertRatio with an error buffer.

With `spi` sampled transitions allowed per inserted one, the limiter keeps
    inserts * spi - samples
within [min_size * spi - error, min_size * spi + error] once replay holds `min_size`:
sampling waits when it runs ahead of collection, collection (dispatch) waits when it runs ahead
of sampling. Before `min_size` inserts, only inserting is allowed.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass
class RateLimiter:
    samples_per_insert: float
    min_size: int
    error_buffer: float
    inserts: int = 0
    samples: int = 0

    def _diff(self, extra_inserts: int = 0) -> float:
        return (self.inserts + extra_inserts) * self.samples_per_insert - self.samples

    @property
    def _target(self) -> float:
        return self.min_size * self.samples_per_insert

    def can_sample(self, batch_size: int) -> bool:
        if self.inserts < self.min_size:
            return False
        return self._diff() - batch_size >= self._target - self.error_buffer

    def can_insert(self, count: int, pending: int = 0) -> bool:
        """May `count` more transitions be collected, with `pending` already on their way?"""
        if self.inserts + pending < self.min_size:
            return True
        return self._diff(pending + count) <= self._target + self.error_buffer

    def on_insert(self, count: int) -> None:
        self.inserts += count

    def on_sample(self, count: int) -> None:
        self.samples += count

    def save(self) -> tuple[dict[str, np.ndarray], dict[str, int]]:
        return {}, {"inserts": self.inserts, "samples": self.samples}

    def restore(self, arrays: Mapping[str, np.ndarray], values: Mapping[str, Any]) -> None:
        self.inserts, self.samples = values["inserts"], values["samples"]


def replay_limiter(
    samples_per_insert: float, learning_starts: int, batch_size: int, chunk: int, task: int,
    error_buffer_chunks: int,
) -> RateLimiter:  # fmt: skip
    """The limiter of an agent learning from replay (DQN, SAC), for chunks of `chunk` transitions
    dispatched in tasks of `task`. Collection may run ahead of training by a few chunks
    (`error_buffer_chunks`), so neither side idles on the other; sampling stops within a batch of
    the band's low edge, from where a whole task must still fit: dispatch sends whole tasks, and a
    band narrower than one would let dispatch (waiting for training) and training (waiting for
    data) each wait for the other for good."""
    spi = samples_per_insert
    error = max(spi * chunk * error_buffer_chunks, spi * task + batch_size)
    return RateLimiter(spi, min_size=learning_starts, error_buffer=error)
