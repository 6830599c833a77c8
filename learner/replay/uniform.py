"""A preallocated numpy ring of transitions, sampled uniformly or by priority (priorities.py);
inserts, samples and priority updates are thread-safe."""

from __future__ import annotations

import threading
from collections.abc import Mapping

import numpy as np

from clusterenv.learner.replay.priorities import Rows, Sampler, Uniform
from clusterenv.pipeline.chunks.priorities import PRIORITY
from clusterenv.pipeline.codec import ArraySpec
from clusterenv.pipeline.spaces import DiscreteActions

# The stored arrays, named as `add` and `sample` name them. `n_steps`: the length of the row's
# return window (pipeline/n_step.py; 1 for one-step rows): its bootstrap is discounted by
# gamma ** n_steps.
FIELDS = ("obs", "action", "reward", "next_obs", "terminated", "n_steps")


class ReplayBuffer:
    """Replay over (obs, action, reward, next_obs, terminated, n_steps)."""

    def __init__(
        self,
        capacity: int,
        obs_shape: tuple[int, ...],
        obs_dtype: np.dtype,
        action: ArraySpec = DiscreteActions.array,
        sampler: Sampler | None = None,
    ):
        """Rows of observations of `obs_shape` and `obs_dtype` and actions of the `action` spec
        (the env's spaces as chunks carry them: pipeline/spaces.py), kept as they arrive and
        drawn by `sampler` (uniformly by default)."""
        self.capacity = capacity
        self.sampler = sampler or Uniform()
        self.rows = Rows(capacity)
        self.obs = np.zeros((capacity, *obs_shape), dtype=obs_dtype)
        self.next_obs = np.zeros_like(self.obs)
        self.action = np.zeros((capacity, *action.row_shape), dtype=np.dtype(action.dtype))
        self.reward = np.zeros(capacity, dtype=np.float32)
        # Only termination stops bootstrapping; a time-limit truncation still bootstraps.
        self.terminated = np.zeros(capacity, dtype=np.float32)
        self.n_steps = np.ones(capacity, dtype=np.uint8)
        self.pos = 0
        self.size = 0
        self.inserted = 0
        self._lock = threading.Lock()

    def add(
        self,
        obs: np.ndarray,
        action: np.ndarray,
        reward: np.ndarray,
        next_obs: np.ndarray,
        terminated: np.ndarray,
        n_steps: np.ndarray | int = 1,
        td_errors: np.ndarray | None = None,
    ) -> None:
        """Rows in insertion order (`td_errors`: the workers' initial priorities, if sent)."""
        n = len(action)
        if n == 0:
            return
        n_steps = np.broadcast_to(n_steps, (n,))
        if n > self.capacity:  # only the newest `capacity` rows can survive anyway
            obs, action, reward = (
                obs[-self.capacity :],
                action[-self.capacity :],
                reward[-self.capacity :],
            )
            next_obs, terminated = next_obs[-self.capacity :], terminated[-self.capacity :]
            n_steps, n = n_steps[-self.capacity :], self.capacity
            td_errors = None if td_errors is None else td_errors[-self.capacity :]
        with self._lock:
            idx = (self.pos + np.arange(n)) % self.capacity
            self.obs[idx] = obs
            self.next_obs[idx] = next_obs
            self.action[idx] = action
            self.reward[idx] = reward
            self.terminated[idx] = terminated
            self.n_steps[idx] = n_steps
            self.rows.written(idx, self.inserted, self.sampler, td_errors)
            self.pos = int((self.pos + n) % self.capacity)
            self.size = min(self.capacity, self.size + n)
            self.inserted += n

    def insert(self, arrays: Mapping[str, np.ndarray]) -> int:
        """One chunk's transitions (its `obs`, `action`, `reward`, `next_obs`, `terminated`,
        `n_steps` where n-step returns were made of them, `priority` where workers sent one)."""
        a = arrays
        self.add(a["obs"], a["action"], a["reward"], a["next_obs"], a["terminated"],
                 a.get("n_steps", 1), a.get(PRIORITY))  # fmt: skip
        return len(a["action"])

    def sample(self, batch_size: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
        """A minibatch of `batch_size` rows, with their `index` and `serial` (for
        `update_priorities`) and, when prioritized, their importance `weight`."""
        with self._lock:
            idx = self.sampler.sample(self.size, batch_size, rng)
            weight = self.sampler.weights_of(idx)
            return {
                "obs": self.obs[idx],
                "action": self.action[idx],
                "reward": self.reward[idx],
                "next_obs": self.next_obs[idx],
                "terminated": self.terminated[idx],
                "n_steps": self.n_steps[idx],
                **self.rows.of(idx, weight),
            }

    def update_priorities(self, batch: Mapping[str, np.ndarray], td_errors: np.ndarray) -> None:
        """The sampled rows' new TD errors (prioritized replay), for those not overwritten since."""
        with self._lock:
            self.rows.update(batch, td_errors, self.sampler)

    def save(self) -> tuple[dict[str, np.ndarray], dict[str, int]]:
        """Copies of the stored rows where they sit in the ring, and the ring's counters (what a
        checkpoint keeps: a restored buffer samples the same rows for the same generator state)."""
        with self._lock:
            rows = {name: getattr(self, name)[: self.size].copy() for name in FIELDS}
            priorities, sampler = self.sampler.save(self.size)
            counters = {"pos": self.pos, "size": self.size, "inserted": self.inserted}
            return rows | self.rows.save(self.size) | priorities, counters | {"sampler": sampler}

    def restore(self, rows: Mapping[str, np.ndarray], counters: Mapping[str, int]) -> None:
        """Take back what `save` returned."""
        size = counters["size"]
        # A checkpoint from before n-step returns has no n_steps: its rows are one-step rows.
        rows = {"n_steps": np.ones(size, np.uint8), **rows}
        if size > self.capacity or any(len(rows[name]) != size for name in FIELDS):
            raise ValueError(f"replay rows do not fit a buffer of {self.capacity}")
        with self._lock:
            for name in FIELDS:
                getattr(self, name)[:size] = rows[name]
            self.pos, self.size, self.inserted = counters["pos"], size, counters["inserted"]
            self.rows.restore(rows, size)
            self.sampler.restore(rows, counters.get("sampler", {}), size)
