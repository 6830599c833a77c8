"""What the remote env's client and its shards say to each other: options, task args, messages."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from gymnasium.envs.registration import EnvSpec
from gymnasium.vector import AutoresetMode

from clusterenv.pipeline.codec import (
    CodecError,
    decode_tree,
    encode_tree,
    pack_message,
    unpack_message,
)
from clusterenv.pipeline.task_args import TaskArgs, TaskArgsError

HOST_SHARD_TASK = "clusterenv.host_shard"

# Request ops (client → shard); a reply echoes the op and the request's sequence number.
HELLO, RESET, STEP, ADOPT, CALL, CLOSE = "hello", "reset", "step", "adopt", "call", "close"
OPS = frozenset({HELLO, RESET, STEP, ADOPT, CALL, CLOSE})
# What a CALL asks of each env: read an attribute, set one, call a method, test for a wrapper.
CALL_KINDS = frozenset({"get", "set", "call", "wrapped"})
# The autoreset modes a shard can run (gymnasium.vector.AutoresetMode values).
AUTORESET_MODES = (AutoresetMode.NEXT_STEP.value, AutoresetMode.SAME_STEP.value)


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
    note_types: bool = False
    """shards note which Python / numpy type each value had (RemoteEnv returns those types;
    a vector env batches into arrays anyway, so it skips the cost: ~10 µs per env step)"""

    def __post_init__(self) -> None:
        for name in ("timeout_s", "placement_timeout_s", "heartbeat_ttl_s", "idle_timeout_s"):
            # Finite too: the shard's task arguments (ShardSpec) refuse NaN and infinity.
            if not 0 < getattr(self, name) < math.inf:
                raise ValueError(f"{name} must be positive and finite, got {getattr(self, name)}")


@dataclass(frozen=True)
class EnvTarget:
    """What each shard makes: a registered id, or a whole EnvSpec (wrappers included) as JSON."""

    env_id: str
    env_kwargs: dict[str, Any] = field(default_factory=dict)
    env_spec: dict[str, Any] | None = None

    @classmethod
    def of(cls, env: str | EnvSpec, env_kwargs: Mapping[str, Any] | None = None) -> EnvTarget:
        """The target of `env`; an EnvSpec that cannot travel as JSON raises ValueError naming why."""
        kwargs = dict(env_kwargs or {})
        if isinstance(env, str):
            return cls(env, kwargs)
        if not isinstance(env, EnvSpec):
            raise TypeError(f"env must be an env id or a gymnasium EnvSpec, got {type(env)}")
        try:
            # to_json refuses callables (a lambda entry point or wrapper argument) itself.
            text = env.to_json()
            EnvSpec.from_json(text)
        except (TypeError, ValueError) as exc:
            raise ValueError(
                f"the EnvSpec of {env.id!r} cannot travel to the workers as JSON: {exc}. Register "
                f"entry points and wrappers by 'module:Name' strings with JSON keyword arguments"
            ) from exc
        return cls(env.id, kwargs, json.loads(text))


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
    env_spec: dict[str, Any] | None = None
    """a gymnasium EnvSpec as the JSON object of EnvSpec.to_json(); made instead of `env_id`"""
    autoreset: str = AutoresetMode.NEXT_STEP.value
    note_types: bool = False

    def check(self) -> None:
        if not self.env_indices:
            raise TaskArgsError("ShardSpec.env_indices must not be empty")
        if self.autoreset not in AUTORESET_MODES:
            raise TaskArgsError(
                f"ShardSpec.autoreset must be one of {AUTORESET_MODES}, got {self.autoreset!r}"
            )
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
    """What makes a reset request unusable by a shard (None if nothing): a reset needs one seed (an
    integer or null) per env, if it gives seeds. A step's actions are checked against the shard's
    action leaves by the shard itself."""
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
