"""Which replay rows a minibatch takes: uniformly, or in proportion to their priorities.

Prioritized replay (Schaul et al. 2016, proportional variant): row i is sampled with probability
P(i) = p_i / sum_k p_k, where p_i = (|TD error| + eps) ** alpha from the row's last update, and a
new row gets the largest priority seen so far (Rainbow's rule), so it is sampled at least once
soon. The bias this brings is corrected by importance weights w_i = (N P(i)) ** -beta, divided by
the largest weight any stored row could get (the paper's max_i w_i, from the smallest priority),
so they only ever scale an update down; the learner anneals beta to 1 over the run.

The "tree" is numpy, a batch at a time, and flat: blocks of 64 leaves with their sums and keys
(SumTree below), so sampling a batch is two `np.searchsorted` calls and writing its priorities one
cumulative sum over the blocks it touches, a dozen numpy calls each way, where a binary tree's
descent takes about a hundred and a 32-wide one no fewer microseconds (docs/benchmarks.md,
"Gradient step"). torchrl's C++ segment trees would do the same in C++ but do not load against torch 2.13.0
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

    def inserted(self, idx: np.ndarray, td_errors: np.ndarray | None = None) -> None:
        """Rows `idx` were just (over)written with new transitions (whose TD errors a worker
        computed, where it did)."""
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

    def inserted(self, idx: np.ndarray, td_errors: np.ndarray | None = None) -> None:
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
    """Sums, and the smallest positive value, of `capacity` non-negative leaves, kept so that a
    batch of prefix sums is found with two `np.searchsorted` calls and a batch of leaves is
    written with one cumulative sum over the blocks it touches.

    The leaves sit in blocks of `block`; per block its sum and its smallest positive leaf; and per
    leaf a key, block index x `scale` + the running sum of its block up to and including it. With
    `scale` at least every block's sum the keys never decrease, so a prefix sum is found as: its
    block from the cumulative block sums, then the first key past block x scale + what is left of
    the prefix (the same leaf a binary sum tree's descent gives; on 2 cores, numpy's ~0.5 µs a call
    made the seventeen levels of that descent cost several times this)."""

    def __init__(self, capacity: int, block: int = 64):
        self.block = block
        blocks = -(-max(1, capacity) // block)
        self.leaves = np.zeros(blocks * block)
        self.block_sums = np.zeros(blocks)
        self.block_mins = np.full(blocks, np.inf)
        self.scale = 1.0  # >= every block's sum; raised (and the keys rebuilt) when one passes it
        self.keys = np.repeat(np.arange(blocks) * self.scale, block)

    @property
    def total(self) -> float:
        return float(self.block_sums.sum())

    @property
    def min(self) -> float:
        return float(self.block_mins.min())

    def get(self, idx: np.ndarray) -> np.ndarray:
        return self.leaves[idx]

    def set(self, idx: np.ndarray, values: np.ndarray) -> None:
        """Leaves `idx` := `values` (a repeated index takes one of its values), then the sums,
        smallest leaves and keys of the blocks they are in."""
        self.leaves[idx] = values
        blocks = np.unique(np.asarray(idx, np.int64) // self.block)
        rows = self.leaves.reshape(-1, self.block)[blocks]
        running = np.cumsum(rows, axis=1)
        # The block's sum is its last running sum, the very number its last key holds: find()
        # relies on the two agreeing.
        self.block_sums[blocks] = running[:, -1]
        self.block_mins[blocks] = np.where(rows > 0, rows, np.inf).min(axis=1)
        top = float(running[:, -1].max(initial=0.0))
        if top > self.scale:
            self.scale = 2.0 * top
            self._rebuild_keys()
        else:
            self.keys.reshape(-1, self.block)[blocks] = blocks[:, None] * self.scale + running

    def _rebuild_keys(self) -> None:
        running = np.cumsum(self.leaves.reshape(-1, self.block), axis=1)
        self.block_sums[:] = running[:, -1]
        offsets = np.arange(len(running))[:, None] * self.scale
        self.keys = (offsets + running).ravel()

    def find(self, prefix: np.ndarray) -> np.ndarray:
        """For each prefix sum in [0, total), the leaf whose cumulative range holds it."""
        ends = np.cumsum(self.block_sums)
        # Rounding can leave a prefix at or past the total, or past its block's sum: keep it just
        # inside, so the leaf found is one with a positive value (never an empty one).
        prefix = np.minimum(np.asarray(prefix, np.float64), np.nextafter(ends[-1], 0))
        block = np.minimum(np.searchsorted(ends, prefix, side="right"), len(ends) - 1)
        left = prefix - (ends[block] - self.block_sums[block])
        left = np.clip(left, 0.0, np.nextafter(self.block_sums[block], 0))
        leaf = np.searchsorted(self.keys, block * self.scale + left, side="right")
        return np.minimum(leaf, (block + 1) * self.block - 1)  # rounding at the block's very end


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

    def inserted(self, idx: np.ndarray, td_errors: np.ndarray | None = None) -> None:
        """New rows at the largest priority so far (Rainbow), or at their TD errors' (Ape-X)."""
        if td_errors is None:
            self.tree.set(idx, np.full(len(idx), self.max_priority))
        else:
            self.update(idx, td_errors)

    def sample(self, size: int, batch_size: int, rng: np.random.Generator) -> np.ndarray:
        # Stratified, as in the paper: one draw from each of batch_size equal slices of the total.
        prefix = (np.arange(batch_size) + rng.random(batch_size)) * (self.tree.total / batch_size)
        # find() lands on a positive leaf, a stored row, unless every row has been forgotten.
        return np.minimum(self.tree.find(prefix), size - 1)

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

    def written(
        self,
        idx: np.ndarray,
        inserted_before: int,
        sampler: Sampler,
        td_errors: np.ndarray | None = None,
    ) -> None:
        self.serial[idx] = inserted_before + np.arange(len(idx))
        sampler.inserted(idx, td_errors)

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
