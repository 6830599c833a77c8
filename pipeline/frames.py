"""Stacked frames on the wire, each frame once: a chunk of an env whose observation is a stack of
its k newest frames (Atari's 4 × 84 × 84 after FrameStackObservation) carries every distinct
frame once and, per transition, the indexes of the k frames of `obs` and of `next_obs`.

Consecutive observations of one env share k − 1 frames: obs_{t+1}[:-1] == obs_t[1:]. The worker's
`FrameEncoder` keeps, per env, the indexes of its current stack and adds to the chunk only what
is new: one frame per step while the stack just shifts, the whole stack when it does not (a reset,
whatever the wrapper pads a new episode's stack with; a padding of repeated frames once). The shift is checked, not assumed, so the
learner's `expand` rebuilds exactly the observations the env produced, and a stack never mixes
two episodes: the reset stack is not a shift of the final one, so it is sent whole. A chunk
starts with each env's current stack in full, so every chunk decodes on its own (a lost or
late chunk costs nothing to the others).

Arrays (pipeline/spaces.py names their specs): `frames` (F, *frame shape), in the `frames` row
group of its own; `obs_frames` and `next_frames` (rows, k) int32 indexes into `frames`.
"""

from __future__ import annotations

import numpy as np

from clusterenv.pipeline.codec import CodecError

# The arrays of a frame-stacked chunk, in place of `obs` and `next_obs`.
FRAMES, OBS_FRAMES, NEXT_FRAMES = "frames", "obs_frames", "next_frames"


class FrameEncoder:
    """Worker side, one chunk: frames of `num_envs` envs' stacks added once each."""

    def __init__(self, first: np.ndarray):
        """`first`: each env's current observation stack, (num_envs, k, *frame shape)."""
        self.frames: list[np.ndarray] = []
        self._last = np.array(first)  # copies: a vector env may reuse its observation buffers
        self._index = np.stack([self._add_all(stack) for stack in first])

    def _add_all(self, stack: np.ndarray) -> np.ndarray:
        """A whole stack, a frame equal to the one before it (a new episode's padding: gymnasium
        repeats its first frame) added once."""
        index = np.empty(len(stack), dtype=np.int32)
        for j, frame in enumerate(stack):
            if j and np.array_equal(frame, stack[j - 1]):
                index[j] = index[j - 1]
            else:
                index[j] = len(self.frames)
                self.frames.append(np.array(frame))
        return index

    def current(self) -> np.ndarray:
        """The indexes of every env's current stack, (num_envs, k)."""
        return self._index.copy()

    def advance(self, stacks: np.ndarray) -> np.ndarray:
        """Every env's next observation stack; the indexes of each, (num_envs, k)."""
        for env, stack in enumerate(stacks):
            # A stack that shifted by one frame adds that frame; any other (a new episode's,
            # padded however the wrapper pads it) is added whole: the two episodes never share.
            if np.array_equal(stack[:-1], self._last[env][1:]):
                self._index[env, :-1] = self._index[env, 1:]
                self._index[env, -1] = len(self.frames)
                self.frames.append(np.array(stack[-1]))
            else:
                self._index[env] = self._add_all(stack)
        self._last = np.array(stacks)
        return self._index.copy()

    def array(self, frame_shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
        """Every frame added, in order: the chunk's `frames` array."""
        if not self.frames:
            return np.empty((0, *frame_shape), dtype=dtype)
        return np.stack(self.frames).astype(dtype, copy=False)


def check_indexes(arrays: dict[str, np.ndarray]) -> None:
    """CodecError unless every index of `obs_frames` and `next_frames` points into `frames`."""
    count = len(arrays[FRAMES])
    for name in (OBS_FRAMES, NEXT_FRAMES):
        index = arrays[name]
        if index.size and (index.min() < 0 or index.max() >= count):
            raise CodecError(f"array {name!r}: indexes outside the chunk's {count} frames")


def expand(arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The chunk's arrays with `obs` and `next_obs` rebuilt from its frames (for consumers that
    keep whole observations: PPO's batches, the reference pool); a chunk without frames as is."""
    if FRAMES not in arrays:
        return arrays
    frames = arrays[FRAMES]
    rest = {k: v for k, v in arrays.items() if k not in (FRAMES, OBS_FRAMES, NEXT_FRAMES)}
    return {**rest, "obs": frames[arrays[OBS_FRAMES]], "next_obs": frames[arrays[NEXT_FRAMES]]}


def observations(arrays: dict[str, np.ndarray], newest: int) -> np.ndarray:
    """The chunk's `newest` last observations (`obs`), rebuilt from its frames when it carries
    stacks (only those: a chunk of Atari stacks rebuilt whole is 28 KB a row)."""
    rows = len(arrays["action"])
    first = max(0, rows - newest)  # not [-newest:]: that is every row for newest = 0
    if FRAMES not in arrays:
        return arrays["obs"][first:]
    return arrays[FRAMES][arrays[OBS_FRAMES][first:]]
