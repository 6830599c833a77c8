"""Which replay rows a minibatch takes: uniformly, or in proportion to their priorities.

Prioritized replay (Schaul et al. 2016, proportional variant): row i is sampled with probability
P(i) = p_i / sum_k p_k, where p_i = (|TD error| + eps) ** alpha from the row's last update, and a
new row gets the largest priority seen so far (Rainbow's rule), so it is sampled at least once
soon. The bias this brings is corrected by importance weights w_i = (N P(i)) ** -beta, divided by
the largest weight any stored row could get (the paper's max_i w_i, from the smallest priority),
so they only ever scale an update down; the learner anneals beta to 1 over the run.

The tree is numpy, a batch at a time: a level's nodes are one fancy-indexing step, so a batch of
64 costs about 2 x depth (17 for 100k rows) small numpy operations to sample and as many to
update. torchrl's C++ segment trees would do the same in C++ but do not load against torch 2.13.0
(undefined symbol), and cpprb's PrioritizedReplayBuffer keeps its own copy of the transitions and
cannot give its priorities back for a checkpoint (bench/update_cost.py compares the costs).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

import numpy as np


class Sampler(Protocol):
    """Row indexes for a minibatch, and what the learner's update tells about them."""

    def sample(self, size: int, batch_size: int, rng: np.random.Generator) -> np.ndarray:
        """`batch_size` row indexes below `size` (their weights: `weights_of`)."""
        ...

    def inserted(self, idx: np.ndarray) -> None:
        """Rows `idx` were just (over)written with new transitions."""
        ...

    def weights_of(self, idx: np.ndarray) -> np.ndarray | None:
        """The importance weights of rows `idx` (None: all 1)."""
        ...

    def update(self, idx: np.ndarray, td_errors: np.ndarray) -> None:
        """Rows `idx` had these TD errors in the update just made."""
        ...

    def forget(self, idx: np.ndarray) -> None:
        """Rows `idx` can no longer be sampled (until they are written again)."""
        ...

    def save(self, rows: int) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        """What a checkpoint keeps of the first `rows` rows: arrays, then values."""
        ...

    def restore(
        self, arrays: Mapping[str, np.ndarray], values: Mapping[str, Any], rows: int
    ) -> None:
        """Take back what `save` returned (from any sampler's checkpoint) for `rows` rows."""
        ...


class Uniform:
    """Every stored row equally likely; importance weights all 1."""

    def sample(self, size: int, batch_size: int, rng: np.random.Generator) -> np.ndarray:
        return rng.integers(size, size=batch_size)

    def inserted(self, idx: np.ndarray) -> None:
        pass

    def weights_of(self, idx: np.ndarray) -> None:
        return None

    def update(self, idx: np.ndarray, td_errors: np.ndarray) -> None:
        pass

    def forget(self, idx: np.ndarray) -> None:
        pass

    def save(self, rows: int) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        return {}, {}

    def restore(
        self, arrays: Mapping[str, np.ndarray], values: Mapping[str, Any], rows: int
    ) -> None:
        pass


class SumTree:
    """Sums, and the smallest positive value, of `capacity` non-negative leaves in a complete
    binary tree stored flat (node k's children are 2k and 2k + 1, the root is 1, leaf i is node
    `leaves + i`)."""

    def __init__(self, capacity: int):
        self.leaves = 1 << max(0, (capacity - 1).bit_length())
        self.depth = self.leaves.bit_length() - 1
        self.sums = np.zeros(2 * self.leaves)
        self.mins = np.full(2 * self.leaves, np.inf)

    @property
    def total(self) -> float:
        return float(self.sums[1])

    @property
    def min(self) -> float:
        return float(self.mins[1])

    def get(self, idx: np.ndarray) -> np.ndarray:
        return self.sums[self.leaves + idx]

    def set(self, idx: np.ndarray, values: np.ndarray) -> None:
        """Leaves `idx` := `values` (a repeated index takes one of its values), then every
        ancestor of them, a level at a time."""
        nodes = self.leaves + np.asarray(idx, np.int64)
        self.sums[nodes] = values
        self.mins[nodes] = np.where(values > 0, values, np.inf)  # the smallest positive leaf
        for _ in range(self.depth):
            # A parent shared by several nodes is recomputed once per node, from the same
            # children: the same value, so the repeats are harmless.
            nodes >>= 1
            left = nodes << 1
            self.sums[nodes] = self.sums[left] + self.sums[left + 1]
            self.mins[nodes] = np.minimum(self.mins[left], self.mins[left + 1])

    def find(self, prefix: np.ndarray) -> np.ndarray:
        """For each prefix sum in [0, total), the leaf whose cumulative range holds it."""
        prefix = np.array(prefix, np.float64)
        nodes = np.ones(len(prefix), np.int64)
        for _ in range(self.depth):
            left = nodes << 1
            left_sum = self.sums[left]
            right = prefix >= left_sum
            prefix -= left_sum * right
            nodes = left + right
        return nodes - self.leaves


class Prioritized:
    """Proportional prioritized sampling over a replay's rows. Not thread-safe: the replay calls
    it under its own lock."""

    def __init__(self, capacity: int, alpha: float, beta: float, eps: float = 1e-6):
        """`alpha`: how much priorities count (0: uniform); `beta`: the importance weights'
        exponent (the learner raises it as the run goes); `eps` keeps a row whose TD error was
        zero sampleable."""
        self.tree = SumTree(capacity)
        self.alpha, self.beta, self.eps = alpha, beta, eps
        self.max_priority = 1.0  # the largest p_i so far (already raised to alpha)

    def inserted(self, idx: np.ndarray) -> None:
        self.tree.set(idx, np.full(len(idx), self.max_priority))

    def sample(self, size: int, batch_size: int, rng: np.random.Generator) -> np.ndarray:
        # Stratified, as in the paper: one draw from each of batch_size equal slices of the total.
        total = self.tree.total
        prefix = (np.arange(batch_size) + rng.random(batch_size)) * (total / batch_size)
        # Rounding can put a prefix at the very total: keep it inside, and on a stored row.
        return np.minimum(self.tree.find(np.minimum(prefix, np.nextafter(total, 0))), size - 1)

    def weights_of(self, idx: np.ndarray) -> np.ndarray:
        # (N P(i)) ** -beta over its largest value, which the smallest priority gives: N and the
        # total cancel in the ratio.
        # (A zero leaf, drawn only by rounding, weighs as the smallest priority: 1.)
        lowest = self.tree.min
        ratio = np.maximum(self.tree.get(idx), lowest) / lowest
        return (ratio**-self.beta).astype(np.float32)

    def update(self, idx: np.ndarray, td_errors: np.ndarray) -> None:
        """New priorities of rows `idx` from their TD errors in the update just made."""
        priorities = (np.abs(td_errors, dtype=np.float64) + self.eps) ** self.alpha
        self.tree.set(idx, priorities)
        self.max_priority = max(self.max_priority, float(priorities.max(initial=0.0)))

    def forget(self, idx: np.ndarray) -> None:
        self.tree.set(idx, np.zeros(len(idx)))

    def save(self, rows: int) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        """The priorities of the first `rows` rows (0: not stored), and the largest so far."""
        return {"priority": self.tree.get(np.arange(rows)).copy()}, {
            "max_priority": self.max_priority
        }

    def restore(
        self, arrays: Mapping[str, np.ndarray], values: Mapping[str, Any], rows: int
    ) -> None:
        """A checkpoint without priorities (a uniform run's) gives each of its `rows` rows the
        largest priority, as a new row gets."""
        self.max_priority = values.get("max_priority", 1.0)
        priorities = arrays.get("priority", np.full(rows, self.max_priority))
        stored = np.flatnonzero(priorities[:rows] > 0)  # a zero leaf is a row never stored
        self.tree.set(stored, priorities[stored])


class Rows:
    """What both replays keep per row for prioritized sampling: the serial of the transition a
    row holds (its insert count), so a priority computed on a row that was overwritten while the
    learner updated on it is dropped, not given to the new transition there (the ingest thread
    inserts while the learner trains)."""

    def __init__(self, capacity: int):
        self.serial = np.zeros(capacity, np.int64)

    def written(self, idx: np.ndarray, inserted_before: int, sampler: Sampler) -> None:
        self.serial[idx] = inserted_before + np.arange(len(idx))
        sampler.inserted(idx)

    def save(self, rows: int) -> dict[str, np.ndarray]:
        return {"serial": self.serial[:rows].copy()}

    def restore(self, arrays: Mapping[str, np.ndarray], rows: int) -> None:
        """The serials `save` gave (a checkpoint from before them: zeros, as good as any while no
        batch is in flight)."""
        self.serial[:rows] = arrays.get("serial", 0)

    def of(self, idx: np.ndarray, weight: np.ndarray | None) -> dict[str, np.ndarray]:
        out = {"index": idx, "serial": self.serial[idx]}
        return out if weight is None else out | {"weight": weight}

    def update(
        self, batch: Mapping[str, np.ndarray], td_errors: np.ndarray, sampler: Sampler
    ) -> None:
        # The trap: rows may have been overwritten since the batch was sampled.
        same = self.serial[batch["index"]] == batch["serial"]
        sampler.update(batch["index"][same], np.asarray(td_errors)[same])
