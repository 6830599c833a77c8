"""What the remote env's client and its shards say to each other: options, task args, messages, spaces."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import gymnasium as gym
import numpy as np

from pipeline.codec import CodecError, decode_tree, encode_tree, pack_message, unpack_message
from pipeline.task_args import TaskArgs, TaskArgsError

HOST_SHARD_TASK = "clusterenv.host_shard"
ECHO_TASK = "clusterenv.echo"

# Request ops (client → shard); a reply echoes the op and the request's sequence number.
HELLO, RESET, STEP, ADOPT, CLOSE = "hello", "reset", "step", "adopt", "close"
OPS = frozenset({HELLO, RESET, STEP, ADOPT, CLOSE})


@dataclass(frozen=True)
class RemoteEnvOptions:
    """How patient a remote vector env and its shards are; keyword arguments of RemoteVectorEnv."""

    timeout_s: float = 60.0
    """seconds a live shard may take to answer one reset/step before ShardTimeout"""
    placement_timeout_s: float = 60.0
    """seconds to wait for workers to start the shards before PlacementError"""
    heartbeat_ttl_s: float = 3.0
    """a shard whose heartbeat is this old counts as lost (its worker died); its envs move"""
    idle_timeout_s: float = 300.0
    """a shard with no request for this long exits and frees its worker"""

    def __post_init__(self) -> None:
        for name in ("timeout_s", "placement_timeout_s", "heartbeat_ttl_s", "idle_timeout_s"):
            # Finite too: the shard's task arguments (ShardSpec) refuse NaN and infinity.
            if not 0 < getattr(self, name) < math.inf:
                raise ValueError(f"{name} must be positive and finite, got {getattr(self, name)}")


@dataclass(frozen=True)
class ShardSpec(TaskArgs):
    """JSON arguments of one `clusterenv.host_shard` task."""

    session: str
    shard: int
    env_id: str
    env_indices: list[int]
    heartbeat_ttl_s: float
    idle_timeout_s: float
    env_kwargs: dict[str, Any] = field(default_factory=dict)

    def check(self) -> None:
        if not self.env_indices:
            raise TaskArgsError("ShardSpec.env_indices must not be empty")
        if self.heartbeat_ttl_s <= 0 or self.idle_timeout_s <= 0:
            raise TaskArgsError(
                f"ShardSpec timeouts must be positive, got heartbeat_ttl_s={self.heartbeat_ttl_s}, "
                f"idle_timeout_s={self.idle_timeout_s}"
            )


@dataclass
class Message:
    """A decoded request or reply: header fields, the `tree` payload, and the named arrays."""

    op: str
    seq: int
    envs: list[int]
    tree: Any = None
    arrays: dict[str, np.ndarray] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)
    shard: int = -1  # set on replies: all shards of an env answer on one list


def pack(msg: Message) -> bytes:
    """Bytes for RPUSH; `tree` may hold numpy values, which travel as raw arrays."""
    tree_arrays: dict[str, np.ndarray] = {}
    tree = encode_tree(msg.tree, tree_arrays)
    clash = set(tree_arrays) & set(msg.arrays)
    if clash:
        raise CodecError(f"array names used twice: {sorted(clash)}")
    header = {**msg.extra, "op": msg.op, "seq": msg.seq, "envs": msg.envs, "tree": tree}
    header["shard"] = msg.shard
    return pack_message(header, {**msg.arrays, **tree_arrays})


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def request_problem(msg: Message) -> str | None:
    """What makes a reset or step request unusable by a shard (None if nothing): a step needs one
    action per env, a reset one seed (an integer or null) per env, if it gives seeds."""
    if msg.op == STEP:
        action = msg.arrays.get("action")
        if action is None or action.ndim == 0 or len(action) != len(msg.envs):
            got = "none" if action is None else f"shape {action.shape}"
            return f"a step needs one action per env ({len(msg.envs)}), got {got}"
    if msg.op == RESET:
        seeds = msg.extra.get("seeds")
        if seeds is not None and (
            not isinstance(seeds, list)
            or len(seeds) != len(msg.envs)
            or not all(s is None or _is_int(s) for s in seeds)
        ):
            return f"a reset needs one seed (an integer or null) per env, got {seeds!r}"
    return None


def unpack(blob: bytes) -> Message:
    """A message from BLPOP bytes; malformed input raises CodecError."""
    header, arrays = unpack_message(blob)
    op, seq, envs = header.pop("op", None), header.pop("seq", None), header.pop("envs", None)
    shard = header.pop("shard", None)
    if op not in OPS or not all(_is_int(x) for x in (seq, shard)):
        raise CodecError(f"not a shard message: op={op!r} seq={seq!r} shard={shard!r}")
    if not isinstance(envs, list) or not all(_is_int(i) for i in envs):
        raise CodecError(f"not a shard message: envs={envs!r}")
    tree = decode_tree(header.pop("tree", None), arrays)
    header.pop("v", None)
    header.pop("arrays", None)
    return Message(op, seq, envs, tree, arrays, header, shard)


# --- Spaces: the client learns them from the shard, so it never needs the simulator itself ---


def space_to_tree(space: gym.Space) -> dict[str, Any]:
    """JSON-tree form of a flat array space; anything else is named so the client can refuse it."""
    if isinstance(space, gym.spaces.Box):
        return {"type": "Box", "low": space.low, "high": space.high, "dtype": space.dtype.str}
    if isinstance(space, gym.spaces.Discrete):
        return {"type": "Discrete", "n": int(space.n), "start": int(space.start)}
    if isinstance(space, gym.spaces.MultiDiscrete):
        return {"type": "MultiDiscrete", "nvec": space.nvec, "start": space.start}
    if isinstance(space, gym.spaces.MultiBinary):
        return {"type": "MultiBinary", "n": np.asarray(space.n).tolist()}
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
    raise NotImplementedError(
        f"the remote env carries Box, Discrete, MultiDiscrete and MultiBinary spaces, "
        f"not {tree.get('repr', kind)}"
    )


def jsonable_metadata(metadata: Mapping[str, Any]) -> dict[str, Any]:
    """The env metadata entries that are plain data (render_fps, render_modes, ...)."""
    plain = (str, int, float, bool, type(None))
    out: dict[str, Any] = {}
    for key, value in metadata.items():
        if isinstance(value, plain) or (
            isinstance(value, list | tuple) and all(isinstance(v, plain) for v in value)
        ):
            out[str(key)] = list(value) if isinstance(value, tuple) else value
    return out
