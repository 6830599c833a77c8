"""An env's spaces on the wire: as JSON trees, and as the array specs of transition chunks.

- The remote env (pipeline/remote_env/) sends a shard's spaces to its client as JSON trees, and a
  Dict or Tuple value as its leaves: one numpy array per Box/Discrete/... subspace, in the space's
  order, batched as gymnasium.vector.utils batches them.
- Transition chunks (pipeline/chunks/) carry observations and actions as the env's spaces say:
  `SpaceSpecs.of(observation_space, action_space)` is what the worker's actor buffers, what the
  learner's stream reader expects and range-checks, and how reference states are stored and read.
  An observation keeps its own dtype and shape (a uint8 84x84x4 frame stays uint8 of that shape);
  an action spec is keyed off the action space: an int64 index of a Discrete space, float32
  values of a bounded Box space (a squashed policy's outputs scaled to the bounds).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol

import gymnasium as gym
import numpy as np

from clusterenv.pipeline.codec import ALLOWED_DTYPES, ArraySpec, wire_dtype

ARRAY_SPACES = (
    gym.spaces.Box,
    gym.spaces.Discrete,
    gym.spaces.MultiDiscrete,
    gym.spaces.MultiBinary,
)


def space_to_tree(space: gym.Space) -> dict[str, Any]:
    """JSON-tree form of a space; kinds the remote env cannot carry are named so the client can refuse them."""
    if isinstance(space, gym.spaces.Box):
        return {"type": "Box", "low": space.low, "high": space.high, "dtype": space.dtype.str}
    if isinstance(space, gym.spaces.Discrete):
        return {"type": "Discrete", "n": int(space.n), "start": int(space.start)}
    if isinstance(space, gym.spaces.MultiDiscrete):
        return {"type": "MultiDiscrete", "nvec": space.nvec, "start": space.start}
    if isinstance(space, gym.spaces.MultiBinary):
        return {"type": "MultiBinary", "n": np.asarray(space.n).tolist()}
    if isinstance(space, gym.spaces.Dict):
        # A list of pairs: the order of the keys is the order of the leaves.
        return {"type": "Dict", "spaces": [[k, space_to_tree(s)] for k, s in space.spaces.items()]}
    if isinstance(space, gym.spaces.Tuple):
        return {"type": "Tuple", "spaces": [space_to_tree(s) for s in space.spaces]}
    return {"type": "unsupported", "repr": repr(space)}


def space_from_tree(tree: Mapping[str, Any]) -> gym.Space:
    """The space `space_to_tree` described; raises NotImplementedError for unsupported kinds."""
    kind = tree.get("type")
    if kind == "Box":
        return gym.spaces.Box(low=tree["low"], high=tree["high"], dtype=np.dtype(tree["dtype"]))
    if kind == "Discrete":
        return gym.spaces.Discrete(tree["n"], start=tree["start"])
    if kind == "MultiDiscrete":
        return gym.spaces.MultiDiscrete(tree["nvec"], start=tree["start"])
    if kind == "MultiBinary":
        return gym.spaces.MultiBinary(tree["n"])
    if kind == "Dict":
        return gym.spaces.Dict({k: space_from_tree(s) for k, s in tree["spaces"]})
    if kind == "Tuple":
        return gym.spaces.Tuple([space_from_tree(s) for s in tree["spaces"]])
    raise NotImplementedError(
        f"the remote env carries Box, Discrete, MultiDiscrete, MultiBinary and Dict/Tuple of "
        f"them, not {tree.get('repr', kind)}"
    )


def leaves(space: gym.Space, value: Any) -> list[Any]:
    """The leaf values of `value` (one env's, or a batch laid out as batch_space does) in space order."""
    if isinstance(space, gym.spaces.Dict):
        return [x for k, sub in space.spaces.items() for x in leaves(sub, value[k])]
    if isinstance(space, gym.spaces.Tuple):
        return [x for sub, v in zip(space.spaces, value, strict=True) for x in leaves(sub, v)]
    return [value]


def from_leaves(space: gym.Space, items: Iterator[Any]) -> Any:
    """Inverse of `leaves`: a dict / tuple / leaf built from the leaf values in order."""
    if isinstance(space, gym.spaces.Dict):
        return {k: from_leaves(sub, items) for k, sub in space.spaces.items()}
    if isinstance(space, gym.spaces.Tuple):
        return tuple(from_leaves(sub, items) for sub in space.spaces)
    return next(items)


def leaf_spaces(space: gym.Space) -> list[gym.Space]:
    """The array spaces at the leaves of `space`."""
    return leaves(space, space)


# --- Transition chunks: what one row of observation and of action is, from the env's spaces ---


def obs_spec(space: gym.Space) -> ArraySpec:
    """One observation of a Box space as it travels: the space's dtype and shape, unchanged."""
    if not isinstance(space, gym.spaces.Box):
        raise ValueError(f"chunks carry Box observations, not {space}")
    dtype = wire_dtype(space.dtype)
    if dtype not in ALLOWED_DTYPES:
        raise ValueError(f"observations of dtype {space.dtype} cannot travel in a chunk")
    return ArraySpec(dtype, tuple(space.shape))


class ActionSpec(Protocol):
    """One action as it travels, and what fits the action space."""

    array: ArraySpec

    @property
    def outputs(self) -> int:
        """How many outputs a network acting on this space has (Q-values or logits: one per
        action; a Gaussian policy: d means and d log-stds)."""
        ...

    def problem(self, actions: np.ndarray) -> str | None:
        """Why a column of actions (of `array`'s dtype and shape) does not fit; None if it does."""
        ...

    def from_index(self, index: np.ndarray) -> np.ndarray:
        """The env's actions for what a behaviour chose: output indices (Discrete), or values in
        [-1, 1] (Box)."""
        ...

    def greedy(self, outputs: np.ndarray) -> np.ndarray:
        """The greedy action for each row of the network's outputs (evaluation)."""
        ...


@dataclass(frozen=True)
class DiscreteActions:
    """A Discrete(n, start) action: an int64 scalar in [start, start + n); output i is action
    start + i."""

    n: int
    start: int = 0
    array: ClassVar[ArraySpec] = ArraySpec("<i8", ())

    @property
    def outputs(self) -> int:
        return self.n

    def problem(self, actions: np.ndarray) -> str | None:
        if actions.size and (actions.min() < self.start or actions.max() >= self.start + self.n):
            return f"action outside [{self.start}, {self.start + self.n})"
        return None

    def from_index(self, index: np.ndarray) -> np.ndarray:
        return index + self.start if self.start else index

    def greedy(self, outputs: np.ndarray) -> np.ndarray:
        return self.from_index(outputs.argmax(axis=1))


@dataclass(frozen=True)
class BoxActions:
    """A bounded Box action: float32 values of the space's shape within [low, high]. A policy
    chooses values in [-1, 1] (a tanh-squashed Gaussian: pipeline/policy.py), scaled here to the
    bounds; the greedy action is the squashed mean."""

    low: tuple[float, ...]
    high: tuple[float, ...]
    shape: tuple[int, ...]

    @classmethod
    def of(cls, space: gym.spaces.Box) -> BoxActions:
        if not (space.is_bounded("both") and np.issubdtype(space.dtype, np.floating)):
            raise ValueError(f"chunks carry float Box actions with finite bounds, not {space}")
        return cls(tuple(space.low.ravel().tolist()), tuple(space.high.ravel().tolist()),
                   tuple(space.shape))  # fmt: skip

    @property
    def array(self) -> ArraySpec:
        return ArraySpec("<f4", self.shape)

    @property
    def dim(self) -> int:
        """Values in one action: the policy's Gaussian has this many dimensions."""
        return len(self.low)

    @property
    def outputs(self) -> int:
        return 2 * self.dim

    def problem(self, actions: np.ndarray) -> str | None:
        flat = actions.reshape(len(actions), -1)
        if not np.isfinite(flat).all():
            return "action is NaN or infinite"
        if (flat < np.array(self.low, np.float32)).any() or (
            flat > np.array(self.high, np.float32)
        ).any():
            return f"action outside the Box bounds [{min(self.low)}, {max(self.high)}]"
        return None

    def from_index(self, index: np.ndarray) -> np.ndarray:
        low, high = np.array(self.low), np.array(self.high)
        scaled = low + (np.asarray(index, np.float64) + 1.0) * 0.5 * (high - low)
        # Clipped after the cast: float32 rounding must not step over a bound.
        out = np.clip(scaled.astype(np.float32), low.astype(np.float32), high.astype(np.float32))
        return out.reshape(len(out), *self.shape)

    def greedy(self, outputs: np.ndarray) -> np.ndarray:
        return self.from_index(np.tanh(outputs[:, : self.dim]))


def action_spec(space: gym.Space) -> ActionSpec:
    """The spec of one action of `space`; ValueError naming a space chunks cannot carry."""
    if isinstance(space, gym.spaces.Discrete):
        return DiscreteActions(int(space.n), int(space.start))
    if isinstance(space, gym.spaces.Box):
        return BoxActions.of(space)
    raise ValueError(f"chunks carry Discrete or Box actions, not {space}")


@dataclass(frozen=True)
class SpaceSpecs:
    """An env's observation and action specs, as chunks carry them. With `stack` = k > 0 an
    observation is a stack of its k newest frames, and chunks carry each frame once
    (pipeline/frames.py)."""

    obs: ArraySpec
    action: ActionSpec
    stack: int = 0

    @classmethod
    def of(
        cls, observation_space: gym.Space, action_space: gym.Space, stack: int = 0
    ) -> SpaceSpecs:
        obs = obs_spec(observation_space)
        if stack and (len(obs.row_shape) < 2 or obs.row_shape[0] != stack):
            raise ValueError(f"a stack of {stack} frames, but observations are {obs.row_shape}")
        return cls(obs, action_spec(action_space), stack)

    @property
    def frame(self) -> ArraySpec:
        """One frame of a stacked observation, in the chunk's `frames` row group."""
        return ArraySpec(self.obs.dtype, self.obs.row_shape[1:], group="frames")


def stack_depth(env: gym.Env) -> int:
    """k when `env`'s observations are stacks of its k newest frames (gymnasium's
    FrameStackObservation is its outermost observation wrapper), else 0."""
    while isinstance(env, gym.Wrapper):
        if isinstance(env, gym.wrappers.FrameStackObservation):
            return int(env.stack_size)
        if isinstance(env, gym.ObservationWrapper):
            return 0  # an observation wrapper outside the stack: not plain stacks any more
        env = env.env
    return 0
