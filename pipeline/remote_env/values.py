"""Values of the remote env: one numpy array per leaf of a space, Python types kept.

A Dict or Tuple value travels as its leaves (one numpy array per Box/Discrete/... subspace, in the
space's order; pipeline/spaces.py), batched as gymnasium.vector.utils batches them. What an env
returned for a scalar (a Python int, a float, a numpy scalar) is noted as a short *kind* string,
so the one-env client can hand back exactly the type the local env returns.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np

from clusterenv.pipeline.codec import ALLOWED_DTYPES
from clusterenv.pipeline.remote_env.messages import Message
from clusterenv.pipeline.spaces import ARRAY_SPACES, leaf_spaces, leaves

# --- Kinds: which Python or numpy type an env returned for one leaf or scalar ---


def kind_of(value: Any) -> str:
    """'b' / 'i' / 'f' for a Python bool / int / float, 's<dtype>' for a numpy scalar, 'a<dtype>' for an array."""
    # numpy first: np.float64 is also a Python float.
    if isinstance(value, np.generic | np.ndarray):
        return ("s" if isinstance(value, np.generic) else "a") + value.dtype.str
    if isinstance(value, bool):
        return "b"
    if isinstance(value, int):
        return "i"
    if isinstance(value, float):
        return "f"
    return ""  # anything else (a list, say) comes back as the batch's numpy value


def restore(value: Any, kind: str) -> Any:
    """One row of a batch (a numpy scalar or array) as the type `kind` names."""
    if kind == "b":
        return bool(value)
    if kind == "i":
        return int(value)
    if kind == "f":
        return float(value)
    if kind[1:] in ALLOWED_DTYPES:
        dtype = np.dtype(kind[1:])
        if kind[0] == "s":
            return dtype.type(value)
        if kind[0] == "a":
            return np.array(value, dtype=dtype)
    return value


class Rows:
    """The observations of n envs as one array per leaf of the space, and, if asked, each value's kind."""

    def __init__(self, space: gym.Space, n: int, note_kinds: bool):
        self.space, self.note_kinds = space, note_kinds
        self.flat = isinstance(space, ARRAY_SPACES)  # one leaf: skip the tree walk per row
        self.arrays = [np.zeros((n, *s.shape), dtype=s.dtype) for s in leaf_spaces(space)]
        self.kinds: list[list[str]] = [[] for _ in range(n)]

    def put(self, j: int, obs: Any, *scalars: Any) -> None:
        """Row j is `obs`; its kinds are those of obs's leaves and then of `scalars`."""
        if self.flat:  # the common case, kept cheap: it runs once per env step
            self.arrays[0][j] = obs
            values = [obs]
        else:
            values = leaves(self.space, obs)
            for array, value in zip(self.arrays, values, strict=True):
                array[j] = value
        if self.note_kinds:
            self.kinds[j] = [kind_of(v) for v in (*values, *scalars)]

    def message(self, op: str, msg: Message, infos: list, errors: list, **columns: Any) -> Message:
        """The reply to `msg`: these rows as arrays `obs0`, `obs1`, ..., `columns`, infos, kinds."""
        arrays = {f"obs{k}": a for k, a in enumerate(self.arrays)} | columns
        tree = infos if any(infos) else None  # most envs return empty infos: send nothing
        extra: dict[str, Any] = {"errors": errors}
        if self.note_kinds:
            # Most shards' envs return the same kinds every row: then one row stands for all.
            uniform = all(k == self.kinds[0] for k in self.kinds)
            extra["kinds"] = self.kinds[:1] if uniform else self.kinds
        return Message(op, msg.seq, msg.envs, tree, arrays, extra)
