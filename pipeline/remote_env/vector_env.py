"""Gymnasium envs whose reset/step run on Celery workers: a drop-in for SyncVectorEnv, and one env.

    envs = gym.vector.SyncVectorEnv([lambda: gym.make("CartPole-v1")] * 8)   # local
    envs = RemoteVectorEnv("CartPole-v1", 8, redis_url="redis://host:6379/0")  # on the workers

With `redis_url=None` an embedded server and local workers are started and owned by the env.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.envs.registration import EnvSpec
from gymnasium.vector import AutoresetMode
from gymnasium.vector.utils import batch_space

from clusterenv.pipeline.cluster.embedded import Stack
from clusterenv.pipeline.remote_env.columns import Batch, ShardColumns
from clusterenv.pipeline.remote_env.group import RemoteEnvError, ShardGroup
from clusterenv.pipeline.remote_env.messages import EnvTarget, RemoteEnvOptions
from clusterenv.pipeline.remote_env.values import restore
from clusterenv.pipeline.spaces import from_leaves, leaf_spaces, leaves, space_from_tree


class RemoteVectorEnv(gym.vector.VectorEnv):
    """`num_envs` copies of an env spread over the workers; autoresets as SyncVectorEnv.

    `env_id` is a registered id or a gymnasium EnvSpec (its wrapper stack is made on the workers).
    Column i is always the same env. `reset(seed=s)` seeds env i with s + i, so trajectories equal
    a local SyncVectorEnv's, in its NEXT_STEP or SAME_STEP `autoreset_mode`. An env whose worker
    dies is rebuilt on a surviving worker and reports `truncated=True` with `infos["worker_lost"]`
    for that step. An env that raises makes `step` raise RemoteEnvError (its `result` holds the
    other envs' step, the failed one truncated). Keyword `options` are the fields of
    RemoteEnvOptions (timeouts, heartbeat TTL).
    """

    def __init__(
        self,
        env_id: str | EnvSpec,
        num_envs: int,
        *,
        redis_url: str | None = None,
        env_kwargs: dict[str, Any] | None = None,
        shards: int | None = None,
        autoreset_mode: AutoresetMode | str = AutoresetMode.NEXT_STEP,
        **options: Any,
    ):
        if num_envs < 1:
            raise ValueError(f"num_envs must be >= 1, got {num_envs}")
        mode = AutoresetMode(autoreset_mode)
        if mode == AutoresetMode.DISABLED:
            raise ValueError("RemoteVectorEnv autoresets NEXT_STEP or SAME_STEP, not DISABLED")
        opts, target = RemoteEnvOptions(**options), EnvTarget.of(env_id, env_kwargs)
        self._stack: Stack | None = None
        self._group: ShardGroup | None = None
        if redis_url is None:
            shards = shards or min(num_envs, os.cpu_count() or 1)
            self._stack = Stack(None, workers=shards).__enter__()
            redis_url = self._stack.redis_url
        try:
            self._group = ShardGroup(redis_url, target, num_envs, shards, opts, mode)
            self._columns = ShardColumns(self._group)
            hello = self._columns.start()
            self.single_observation_space = space_from_tree(hello["observation_space"])
            self.single_action_space = space_from_tree(hello["action_space"])
        except BaseException:
            self.close_extras()
            raise
        self._columns.obs_space = self.single_observation_space
        self.env_id, self.redis_url, self.num_envs = target.env_id, redis_url, num_envs
        self.observation_space = batch_space(self.single_observation_space, num_envs)
        self.action_space = batch_space(self.single_action_space, num_envs)
        self.metadata = {**hello.get("metadata", {}), "autoreset_mode": mode}
        self.render_mode = hello.get("render_mode")
        self._needs_reset = True

    @property
    def session(self) -> str:
        """The id under which this env's keys live on the broker (`clusterenv:renv:{session}:…`)."""
        if self._group is None:
            raise RuntimeError("this RemoteVectorEnv is closed")
        return self._group.session

    @property
    def owned_pids(self) -> list[int]:
        """Processes of the embedded stack this env started (none when given a redis_url)."""
        return self._stack.pids if self._stack is not None else []

    @property
    def shards(self) -> list[dict[str, Any]]:
        """Each live shard: its id, worker hostname and process id, and its env columns."""
        live = self._group.live.values() if self._group else []
        return [
            {"shard": r.id, "worker": r.worker, "pid": r.pid, "envs": list(r.envs)} for r in live
        ]

    def reset(
        self, *, seed: int | list[int | None] | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Any, dict[str, Any]]:
        batch = self.reset_batch(seed, options)
        return self.observations(batch), self._vector_infos(batch)

    def observations(self, batch: Batch) -> Any:
        """The batched observation: an array, or a dict / tuple of arrays as batch_space lays out."""
        return from_leaves(self.single_observation_space, iter(batch.obs_leaves))

    def reset_batch(self, seed: int | list[int | None] | None, options: dict | None) -> Batch:
        """reset() as a Batch: per-env infos and the types the envs returned (for adapters)."""
        n = self.num_envs
        if seed is None:
            seeds: list[int | None] = [None] * n
        elif isinstance(seed, int):
            seeds = [seed + i for i in range(n)]
        else:
            seeds = list(seed)
            if len(seeds) != n:
                raise ValueError(f"{len(seeds)} seeds given for num_envs={n}")
        envs = list(range(n))
        if options is not None and "reset_mask" in options:
            options = dict(options)
            mask = options.pop("reset_mask")
            if not isinstance(mask, np.ndarray) or mask.shape != (n,) or mask.dtype != np.bool_:
                raise ValueError(f"options['reset_mask'] must be a bool array of shape ({n},)")
            if self._needs_reset and not mask.all():
                raise ValueError("the first reset() must reset every env")
            envs = np.flatnonzero(mask).tolist()
        batch = self._columns.reset(envs, [seeds[i] for i in envs], options)
        if batch.errors:
            self._raise_errors(batch.errors, self.observations(batch), self._vector_infos(batch))
        self._needs_reset = False
        return batch

    def step(self, actions: Any) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        batch = self.step_batch(actions)
        return (
            self.observations(batch), batch.rewards, batch.terminated, batch.truncated,
            self._vector_infos(batch),
        )  # fmt: skip

    def step_batch(self, actions: Any) -> Batch:
        """step() as a Batch: per-env infos and the types the envs returned (for adapters)."""
        if self._needs_reset:
            raise gym.error.ResetNeeded("call reset() before step() on a RemoteVectorEnv")
        batch = self._columns.step(self._checked(actions))
        if batch.errors:
            result = (self.observations(batch), batch.rewards, batch.terminated, batch.truncated)
            self._raise_errors(batch.errors, *result, self._vector_infos(batch))
        return batch

    def _checked(self, actions: Any) -> list[np.ndarray]:
        """The actions as one array per leaf of the space, or a clear error before anything is sent."""
        space = self.single_action_space
        try:
            given = leaves(space, actions)
        except (KeyError, IndexError, TypeError, ValueError) as exc:
            raise ValueError(
                f"actions do not fit the batched action space {self.action_space}: {exc!r}"
            ) from None
        checked = []
        for leaf, batched, a in zip(
            leaf_spaces(space), leaf_spaces(self.action_space), given, strict=True
        ):
            checked.append(self._checked_leaf(leaf, batched, np.asarray(a)))
        return checked

    def _checked_leaf(self, space: gym.Space, batched: gym.Space, a: np.ndarray) -> np.ndarray:
        n = self.num_envs
        if a.shape != (n, *space.shape):
            raise ValueError(
                f"actions have shape {a.shape}, expected {(n, *space.shape)} "
                f"({n} envs x action shape {space.shape} of {space})"
            )
        kinds = "biuf" if isinstance(space, gym.spaces.Box) else "biu"
        if a.dtype.kind not in kinds:
            raise TypeError(f"actions of dtype {a.dtype} do not fit {space}")
        a = a.astype(space.dtype, copy=False)
        if isinstance(space, gym.spaces.Discrete):  # the common case, checked in one pass
            inside = bool(np.all((a >= space.start) & (a < space.start + space.n)))
        else:
            inside = batched.contains(a)
        if not inside:
            for i in range(n):
                if not space.contains(a[i]):
                    raise gym.error.InvalidAction(
                        f"action {a[i]!r} for env {i} is outside the action space {space}"
                    )
        return a

    def _raise_errors(self, errors: list[dict[str, Any]], *result: Any) -> None:
        first = errors[0]
        others = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
        raise RemoteEnvError(
            f"env {first['env']} ({self.env_id}, shard {first['shard']} on {first['worker']}) "
            f"raised in {first['where']}(): {first['type']}: {first['message']}{others}; "
            f"the other envs went on. Remote traceback:\n{first['traceback']}",
            errors,
            result=tuple(result) or None,
        )

    def _vector_infos(self, batch: Batch) -> dict[str, Any]:
        infos: dict[str, Any] = {}
        for i, info in enumerate(batch.infos):
            if info:
                infos = self._add_info(infos, info, i)
        for err in batch.errors:
            infos = self._add_info(infos, {"env_error": True}, err["env"])
        return infos

    # --- Attributes and methods of the remote envs, as SyncVectorEnv's call / get_attr / set_attr ---

    def call(self, name: str, *args: Any, **kwargs: Any) -> tuple[Any, ...]:
        """Call method `name` of every env (or read it, if not callable); results per env.

        Arguments and results travel as the info codec carries them: JSON, numpy values, lists,
        tuples and dicts; any other result arrives as its repr() string.
        """
        request = {"kind": "call", "name": name, "args": list(args), "kwargs": kwargs}
        return tuple(self.remote_call(request, range(self.num_envs)))

    def get_attr(self, name: str) -> tuple[Any, ...]:
        """Attribute `name` of every env (through its wrappers, as get_wrapper_attr)."""
        return tuple(self.remote_call({"kind": "get", "name": name}, range(self.num_envs)))

    def set_attr(self, name: str, values: list[Any] | tuple[Any, ...] | Any) -> None:
        """Set attribute `name` of every env: one value for all, or a list of one per env."""
        if not isinstance(values, list | tuple):
            values = [values] * self.num_envs
        if len(values) != self.num_envs:
            raise ValueError(f"{len(values)} values given for num_envs={self.num_envs}")
        self.remote_call({"kind": "set", "name": name}, range(self.num_envs), list(values))

    def remote_call(
        self, request: dict[str, Any], envs: Iterable[int], values: list[Any] | None = None
    ) -> list[Any]:
        """Each of `envs`' answer to a CALL request; AttributeError / RemoteEnvError as they raised."""
        results, errors = self._columns.call(list(envs), request, values)
        if errors:
            first = errors[0]
            if first["type"] == "AttributeError":
                raise AttributeError(f"env {first['env']} ({self.env_id}): {first['message']}")
            self._raise_errors(errors)
        return results

    def close_extras(self, **kwargs: Any) -> None:
        try:
            if self._group is not None:
                self._group.close()
                self._group = None
        finally:
            if self._stack is not None:
                self._stack.close()
                self._stack = None

    def __del__(self) -> None:
        # A forgotten close() must still free the workers (and stop an owned embedded stack).
        if not getattr(self, "closed", True):
            with contextlib.suppress(Exception):
                self.close()


class RemoteEnv(gym.Env):
    """One remote env, a thin wrapper on a one-column RemoteVectorEnv; returns the local env's types."""

    def __init__(
        self,
        env_id: str | EnvSpec,
        *,
        redis_url: str | None = None,
        env_kwargs: dict[str, Any] | None = None,
        **options: Any,
    ):
        self._vec = RemoteVectorEnv(
            env_id, 1, redis_url=redis_url, env_kwargs=env_kwargs, shards=1, note_types=True,
            **options,
        )  # fmt: skip
        self.observation_space = self._vec.single_observation_space
        self.action_space = self._vec.single_action_space
        self.metadata = {k: v for k, v in self._vec.metadata.items() if k != "autoreset_mode"}
        self.metadata.setdefault("render_modes", [])
        self.render_mode = self._vec.render_mode
        self._n_leaves = len(leaf_spaces(self.observation_space))

    def _restored(self, batch: Batch, *columns: np.ndarray) -> list[Any]:
        """Row 0's observation and `columns` as the types the env returned (noted by the shard)."""
        n = self._n_leaves
        # No kinds (a lost worker's row): the batch's numpy values as they are.
        kinds = batch.kinds[0] + [""] * (n + len(columns) - len(batch.kinds[0]))
        obs = [restore(a[0], kinds[k]) for k, a in enumerate(batch.obs_leaves)]
        rest = [restore(c[0], kinds[n + k]) for k, c in enumerate(columns)]
        return [from_leaves(self.observation_space, iter(obs)), *rest]

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Any, dict[str, Any]]:
        super().reset(seed=seed)  # seeds the local np_random, as Env.reset promises
        batch = self._vec.reset_batch(seed, options)
        return self._restored(batch)[0], batch.infos[0]

    def step(self, action: Any) -> tuple[Any, Any, Any, Any, dict[str, Any]]:
        space = self.action_space
        one = [np.asarray(a)[None] for a in leaves(space, action)]
        batch = self._vec.step_batch(from_leaves(space, iter(one)))
        obs, reward, terminated, truncated = self._restored(
            batch, batch.rewards, batch.terminated, batch.truncated
        )
        return obs, reward, terminated, truncated, batch.infos[0]

    def close(self) -> None:
        self._vec.close()
