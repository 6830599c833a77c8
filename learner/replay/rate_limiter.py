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
