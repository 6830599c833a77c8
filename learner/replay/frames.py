"""Replay of stacked-frame transitions with each frame stored once (Atari: a 4-frame
observation and its successor share 3 frames; storing obs and next_obs would hold each frame 8
times).

Frames sit in a ring of their own, numbered by a running serial; a transition keeps the serials of
the k frames of its observation and of its next observation, as the chunk's indexes
(pipeline/frames.py) named them. Sampling gathers the stacks back, so a stack is always exactly one
the env produced: it never mixes two episodes, since the worker sent a new episode's stack whole.
A transition whose oldest frame the ring has overwritten since is no longer sampled (frames
arrive a little faster than transitions: each chunk's first stacks, and a new episode's first
frame), so the frame ring is sized a little over the transition ring.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any

import numpy as np

from clusterenv.learner.replay.priorities import Rows, Sampler, Uniform
from clusterenv.pipeline.chunks.priorities import PRIORITY
from clusterenv.pipeline.codec import ArraySpec
from clusterenv.pipeline.frames import FRAMES, NEXT_FRAMES, OBS_FRAMES

# Frame slots per transition slot. A chunk adds a little over one frame per transition (its first
# stacks, each episode's first frame: 1.008 for Pong in chunks of 8 x 128), so the ring holds
# about one frame per transition and the oldest ~1% of transitions, whose first frames are
# already overwritten, are not sampled: more slack would cost 7 KB a slot for rows rarely used.
FRAME_SLACK = 1.0
# Resamples of a batch's rows whose frames were overwritten, before giving up on them.
RESAMPLES = 8


class FrameReplay:
    """Replay over (stacked obs, action, reward, stacked next obs, terminated, n_steps), drawn by
    `sampler` (uniformly by default)."""

    def __init__(
        self,
        capacity: int,
        stack: int,
        frame: ArraySpec,
        action: ArraySpec,
        sampler: Sampler | None = None,
    ):
        self.capacity, self.stack = capacity, stack
        self.sampler = sampler or Uniform()
        self.rows = Rows(capacity)
        self.frame_capacity = int(capacity * FRAME_SLACK) + 64 * stack
        self.frames = np.zeros((self.frame_capacity, *frame.row_shape), np.dtype(frame.dtype))
        self.frame_count = 0  # frames ever stored: the next frame's serial
        self.obs_serial = np.zeros((capacity, stack), np.int64)
        self.next_serial = np.zeros((capacity, stack), np.int64)
        self.action = np.zeros((capacity, *action.row_shape), np.dtype(action.dtype))
        self.reward = np.zeros(capacity, np.float32)
        # Only termination stops bootstrapping; a time-limit truncation still bootstraps.
        self.terminated = np.zeros(capacity, np.float32)
        self.n_steps = np.ones(capacity, np.uint8)  # the return window's length (uniform.py)
        self.pos = self.size = self.inserted = 0
        self._lock = threading.Lock()

    @property
    def nbytes(self) -> int:
        """Memory the replay holds, frames and transitions."""
        columns = (self.frames, self.obs_serial, self.next_serial, self.action, self.reward,
                   self.terminated, self.n_steps, self.rows.serial)  # fmt: skip
        return sum(a.nbytes for a in columns)

    def insert(self, arrays: Mapping[str, np.ndarray]) -> int:
        """One chunk's frames and transitions (its `frames`, `obs_frames`, `next_frames`, ...)."""
        frames, n = arrays[FRAMES], len(arrays["action"])
        if len(frames) > self.frame_capacity or n > self.capacity:
            raise ValueError(f"a chunk of {len(frames)} frames, {n} rows does not fit the replay")
        with self._lock:
            base = self.frame_count
            self.frames[(base + np.arange(len(frames))) % self.frame_capacity] = frames
            self.frame_count += len(frames)
            idx = (self.pos + np.arange(n)) % self.capacity
            self.obs_serial[idx] = base + arrays[OBS_FRAMES]
            self.next_serial[idx] = base + arrays[NEXT_FRAMES]
            self.action[idx] = arrays["action"]
            self.reward[idx] = arrays["reward"]
            self.terminated[idx] = arrays["terminated"]
            self.n_steps[idx] = arrays.get("n_steps", 1)
            self.rows.written(idx, self.inserted, self.sampler, arrays.get(PRIORITY))
            self.pos = int((self.pos + n) % self.capacity)
            self.size = min(self.capacity, self.size + n)
            self.inserted += n
        return n

    def _alive(self, idx: np.ndarray) -> np.ndarray:
        """Whether every frame of rows `idx` is still in the ring."""
        oldest = self.frame_count - self.frame_capacity
        return self.obs_serial[idx].min(axis=1) >= oldest

    def sample(self, batch_size: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
        """A minibatch as ReplayBuffer.sample gives it."""
        with self._lock:
            idx = self.sampler.sample(self.size, batch_size, rng)
            for _ in range(RESAMPLES):
                dead = ~self._alive(idx)
                if not dead.any():
                    break
                # Their frames are gone: never again drawn, whatever their priority.
                self.sampler.forget(idx[dead])
                idx[dead] = self.sampler.sample(self.size, int(dead.sum()), rng)
            else:
                idx = idx[self._alive(idx)]  # a ring this short of frames: a smaller batch
            weight = self.sampler.weights_of(idx)  # of the rows finally drawn
            ring = self.frame_capacity
            return {
                "obs": self.frames[self.obs_serial[idx] % ring],
                "action": self.action[idx],
                "reward": self.reward[idx],
                "next_obs": self.frames[self.next_serial[idx] % ring],
                "terminated": self.terminated[idx],
                "n_steps": self.n_steps[idx],
                **self.rows.of(idx, weight),
            }

    def update_priorities(self, batch: Mapping[str, np.ndarray], td_errors: np.ndarray) -> None:
        """As ReplayBuffer.update_priorities."""
        with self._lock:
            self.rows.update(batch, td_errors, self.sampler)

    def save(self) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        """The rings as they are and their counters (a restored replay samples the same rows for
        the same generator state)."""
        with self._lock:
            arrays = {name: getattr(self, name).copy() for name in _COLUMNS}
            counters = {"pos": self.pos, "size": self.size, "inserted": self.inserted,
                        "frame_count": self.frame_count}  # fmt: skip
            priorities, sampler = self.sampler.save(self.capacity)
            rows = self.rows.save(self.capacity)
            return arrays | rows | priorities, counters | {"sampler": sampler}

    def restore(self, arrays: Mapping[str, np.ndarray], counters: Mapping[str, int]) -> None:
        """Take back what `save` returned (a checkpoint from before n-step returns has one-step
        rows)."""
        arrays = {"n_steps": np.ones(self.capacity, np.uint8), **arrays}
        for name in _COLUMNS:
            if arrays[name].shape != getattr(self, name).shape:
                raise ValueError(f"replay's {name} {arrays[name].shape} does not fit this replay")
        with self._lock:
            for name in _COLUMNS:
                getattr(self, name)[:] = arrays[name]
            self.pos, self.size = counters["pos"], counters["size"]
            self.inserted, self.frame_count = counters["inserted"], counters["frame_count"]
            self.rows.restore(arrays, self.capacity)
            self.sampler.restore(arrays, counters.get("sampler", {}), self.size)


_COLUMNS = ("frames", "obs_serial", "next_serial", "action", "reward", "terminated", "n_steps")
