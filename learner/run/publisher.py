"""Publishing policy versions: weights, and a probe on reference states drawn from the newest
observations the learner accepted.

The probe is computed with the same numpy forward the workers act with, so identical weights give
a divergence of exactly zero. The publisher also remembers the update count behind each version,
which turns a chunk's behaviour version into a lag in gradient steps.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from clusterenv.learner.config import WeightSyncConfig
from clusterenv.pipeline.frames import observations
from clusterenv.pipeline.policy import numpy_policy
from clusterenv.pipeline.roles import WeightSource
from clusterenv.pipeline.sync.source import reference_pool_rows


class ReferencePool:
    """The newest accepted chunks (the ingest thread adds them), kept as they arrived, from whose
    observations reference states are drawn, whatever the agent keeps (DQN's replay, PPO's
    queue); at least `capacity` observations, `reference_pool_rows(--reference-size)`. Stacked
    frames are rebuilt into observations only for the few rows `recent` is asked for (a chunk of
    Atari stacks rebuilt whole on every arrival cost the ingest thread 27 us a row)."""

    def __init__(self, capacity: int):
        self.capacity = capacity
        self._chunks: deque[dict[str, np.ndarray]] = deque()
        self._rows = 0  # observations in the chunks held
        self._lock = threading.Lock()

    @property
    def size(self) -> int:
        return min(self._rows, self.capacity)

    def add(self, arrays: dict[str, np.ndarray]) -> None:
        """One accepted chunk's arrays (whole observations, or frames and their indexes)."""
        with self._lock:
            self._chunks.append(arrays)
            self._rows += len(arrays["action"])
            while self._rows - len(self._chunks[0]["action"]) >= self.capacity:
                self._rows -= len(self._chunks.popleft()["action"])

    def recent(self, count: int) -> np.ndarray:
        """The `count` most recently added observations, newest first (fewer if it holds fewer)."""
        with self._lock:
            chunks = list(self._chunks)
        parts, wanted = [], min(count, self.size)
        for arrays in reversed(chunks):
            take = min(wanted, len(arrays["action"]))
            parts.append(observations(arrays, take)[::-1])
            wanted -= take
            if not wanted:
                break
        return np.concatenate(parts) if parts else np.zeros((0,))


def wire_weights(weights: Mapping[str, np.ndarray], dtype: str) -> dict[str, np.ndarray]:
    """`weights` with every float array as `dtype` (--weights-dtype), the others as they are."""
    return {
        name: a.astype(dtype, copy=False) if np.issubdtype(a.dtype, np.floating) else a
        for name, a in weights.items()
    }


class Publisher:
    def __init__(
        self,
        source: WeightSource,
        pool: ReferencePool,
        cfg: WeightSyncConfig,
        rng: np.random.Generator,
        on_version: Callable[[int], None] = lambda version: None,
        value_probe: Callable[[np.ndarray, np.ndarray], np.ndarray] | None = None,
    ):
        """`value_probe`: the columns the learner adds to each probe row (Agent.value_probe),
        where the run's sync measure needs them."""
        self.source, self.pool, self.cfg, self.rng = source, pool, cfg, rng
        self.value_probe = value_probe
        self.on_version = on_version  # told each version number before it is published
        self.updates_at_version: dict[int, int] = {}  # a resumed run's versions start above 0

    @property
    def version(self) -> int:
        return self.source.version

    def publish(
        self, weights: Mapping[str, np.ndarray], updates: int, new_reference: bool = False
    ) -> int:
        """A new version of `weights` (trained for `updates` gradient steps), with its probe;
        `new_reference` publishes new reference states first (the broker lost the old ones)."""
        # The probe is computed on the weights as published, so a float16 version's probe is the
        # outputs of exactly what the workers act with.
        weights = wire_weights(weights, self.cfg.weights_dtype)
        probe = None
        size = self.cfg.reference_size
        if self.pool.size >= size:
            due = (self.version + 1) % self.cfg.reference_every == 0
            if self.source.reference is None or due or new_reference:
                recent = self.pool.recent(reference_pool_rows(size))
                pick = self.rng.choice(len(recent), size=size, replace=False)
                # As the env observes them (dtype and shape): the workers read them so.
                self.source.publish_reference(recent[pick])
            reference = self.source.reference
            probe = numpy_policy(weights)(reference)
            if self.value_probe is not None:
                probe = np.concatenate([probe, self.value_probe(reference, probe)], axis=1)
        self.updates_at_version[self.version + 1] = updates  # before any chunk can carry it
        self.on_version(self.version + 1)
        return self.source.publish(weights, probe)

    def lag(self, behaviour_version: int, updates: int) -> tuple[int, int]:
        """Lag of a chunk acted with `behaviour_version`: (versions, gradient steps) behind now."""
        then = self.updates_at_version.get(behaviour_version)
        lag_updates = updates - then if then is not None else 0
        return self.version - behaviour_version, lag_updates

    def save(self) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        return {}, {"version": self.version, "rng": self.rng.bit_generator.state}

    def restore(self, arrays: Mapping[str, np.ndarray], values: Mapping[str, Any]) -> None:
        """Versions continue above the saved one (see `continue_above`)."""
        self.rng.bit_generator.state = values["rng"]
        self.continue_above(values["version"])

    def continue_above(self, version: int) -> None:
        """Number the next version above `version` too: a resumed learner never reuses a version
        that workers may still hold."""
        self.source.version = max(self.source.version, version)
