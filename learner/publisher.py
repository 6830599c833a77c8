"""Publishing policy versions: weights, and a probe on reference states refreshed from replay.

The probe is computed with the same numpy forward the workers act with, so identical weights give
a divergence of exactly zero. The publisher also remembers the update count behind each version,
which turns a chunk's behaviour version into a lag in gradient steps.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import numpy as np

from clusterenv.learner.config import WeightSyncConfig
from clusterenv.learner.replay import ReplayBuffer
from clusterenv.pipeline.policy import NumpyMLP
from clusterenv.pipeline.roles import WeightSource
from clusterenv.pipeline.sync.source import reference_pool_rows


class Publisher:
    def __init__(
        self,
        source: WeightSource,
        replay: ReplayBuffer,
        cfg: WeightSyncConfig,
        rng: np.random.Generator,
        on_version: Callable[[int], None] = lambda version: None,
    ):
        self.source, self.replay, self.cfg, self.rng = source, replay, cfg, rng
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
        probe = None
        size = self.cfg.reference_size
        if self.replay.size >= size:
            due = (self.version + 1) % self.cfg.reference_every == 0
            if self.source.reference is None or due or new_reference:
                recent = self.replay.recent_obs(reference_pool_rows(size))
                pick = self.rng.choice(len(recent), size=size, replace=False)
                # As the env observes them (dtype and shape): the workers read them so.
                self.source.publish_reference(recent[pick])
            probe = NumpyMLP(weights)(self.source.reference)
        self.updates_at_version[self.version + 1] = updates  # before any chunk can carry it
        self.on_version(self.version + 1)
        return self.source.publish(weights, probe)

    def lag(self, behaviour_version: int, updates: int) -> tuple[int, int]:
        """Lag of a chunk acted with `behaviour_version`: (versions, gradient steps) behind now."""
        then = self.updates_at_version.get(behaviour_version)
        lag_updates = updates - then if then is not None else 0
        return self.version - behaviour_version, lag_updates
