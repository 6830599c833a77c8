"""Gymnasium envs whose reset/step run on Celery workers: a drop-in for SyncVectorEnv, and one env.

    envs = gym.vector.SyncVectorEnv([lambda: gym.make("CartPole-v1")] * 8)   # local
    envs = RemoteVectorEnv("CartPole-v1", 8, redis_url="redis://host:6379/0")  # on the workers

With `redis_url=None` an embedded server and local workers are started and owned by the env.
"""

from __future__ import annotations

import contextlib
import os
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.vector import AutoresetMode
from gymnasium.vector.utils import batch_space

from pipeline.cluster.embedded import Stack
from pipeline.remote_env.columns import Batch, ShardColumns
from pipeline.remote_env.group import RemoteEnvError, ShardGroup
from pipeline.remote_env.messages import RemoteEnvOptions, space_from_tree


class RemoteVectorEnv(gym.vector.VectorEnv):
    """`num_envs` copies of `env_id` spread over the workers; autoresets NEXT_STEP as SyncVectorEnv.

    Column i is always the same env. `reset(seed=s)` seeds env i with s + i, so trajectories equal
    a local SyncVectorEnv's. An env whose worker dies is rebuilt on a surviving worker and reports
    `truncated=True` with `infos["worker_lost"]` for that step. An env that raises makes `step`
    raise RemoteEnvError (its `result` holds the other envs' step, the failed one truncated).
    Keyword `options` are the fields of RemoteEnvOptions (timeouts, heartbeat TTL).
    """

    def __init__(
        self,
        env_id: str,
        num_envs: int,
        *,
        redis_url: str | None = None,
        env_kwargs: dict[str, Any] | None = None,
        shards: int | None = None,
        **options: float,
    ):
        if num_envs < 1:
            raise ValueError(f"num_envs must be >= 1, got {num_envs}")
        opts = RemoteEnvOptions(**options)
        self._stack: Stack | None = None
        self._group: ShardGroup | None = None
        if redis_url is None:
            shards = shards or min(num_envs, os.cpu_count() or 1)
            self._stack = Stack(None, workers=shards).__enter__()
            redis_url = self._stack.redis_url
        try:
            self._group = ShardGroup(
                redis_url, env_id, num_envs, dict(env_kwargs or {}), shards, opts
            )
            self._columns = ShardColumns(self._group)
            hello = self._columns.start()
            self.single_observation_space = space_from_tree(hello["observation_space"])
            self.single_action_space = space_from_tree(hello["action_space"])
        except BaseException:
            self.close_extras()
            raise
        obs_space = self.single_observation_space
        self._columns.set_obs_space(obs_space.shape, obs_space.dtype)
        self.env_id, self.redis_url, self.num_envs = env_id, redis_url, num_envs
        self.observation_space = batch_space(obs_space, num_envs)
        self.action_space = batch_space(self.single_action_space, num_envs)
        self.metadata = {**hello.get("metadata", {}), "autoreset_mode": AutoresetMode.NEXT_STEP}
        self.render_mode = None
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
    ) -> tuple[np.ndarray, dict[str, Any]]:
        batch = self._reset_batch(seed, options)
        return batch.obs, self._vector_infos(batch)

    def _reset_batch(self, seed: int | list[int | None] | None, options: dict | None) -> Batch:
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
            self._raise_errors(batch, batch.obs, self._vector_infos(batch))
        self._needs_reset = False
        return batch

    def step(
        self, actions: Any
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        batch = self._step_batch(actions)
        return (
            batch.obs, batch.rewards, batch.terminated, batch.truncated, self._vector_infos(batch)
        )  # fmt: skip

    def _step_batch(self, actions: Any) -> Batch:
        if self._needs_reset:
            raise gym.error.ResetNeeded("call reset() before step() on a RemoteVectorEnv")
        batch = self._columns.step(self._checked(actions))
        if batch.errors:
            result = (batch.obs, batch.rewards, batch.terminated, batch.truncated)
            self._raise_errors(batch, *result, self._vector_infos(batch))
        return batch

    def _checked(self, actions: Any) -> np.ndarray:
        """The actions as the space's dtype, or a clear error before anything is sent."""
        space, n = self.single_action_space, self.num_envs
        a = np.asarray(actions)
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
            inside = self.action_space.contains(a)
        if not inside:
            for i in range(n):
                if not space.contains(a[i]):
                    raise gym.error.InvalidAction(
                        f"action {a[i]!r} for env {i} is outside the action space {space}"
                    )
        return a

    def _raise_errors(self, batch: Batch, *result: Any) -> None:
        first = batch.errors[0]
        others = f" (and {len(batch.errors) - 1} more)" if len(batch.errors) > 1 else ""
        raise RemoteEnvError(
            f"env {first['env']} ({self.env_id}, shard {first['shard']} on {first['worker']}) "
            f"raised in {first['where']}(): {first['type']}: {first['message']}{others}; "
            f"the other envs went on. Remote traceback:\n{first['traceback']}",
            batch.errors,
            result=tuple(result),
        )

    def _vector_infos(self, batch: Batch) -> dict[str, Any]:
        infos: dict[str, Any] = {}
        for i, info in enumerate(batch.infos):
            if info:
                infos = self._add_info(infos, info, i)
        for err in batch.errors:
            infos = self._add_info(infos, {"env_error": True}, err["env"])
        return infos

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
    """One remote env, a thin wrapper on a one-column RemoteVectorEnv; passes check_env."""

    def __init__(self, env_id: str, *, redis_url: str | None = None, **options: Any):
        self._vec = RemoteVectorEnv(env_id, 1, redis_url=redis_url, shards=1, **options)
        self.observation_space = self._vec.single_observation_space
        self.action_space = self._vec.single_action_space
        self.metadata = {k: v for k, v in self._vec.metadata.items() if k != "autoreset_mode"}
        self.metadata.setdefault("render_modes", [])
        self.render_mode = None

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        super().reset(seed=seed)  # seeds the local np_random, as Env.reset promises
        batch = self._vec._reset_batch(seed, options)
        return batch.obs[0], batch.infos[0]

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        batch = self._vec._step_batch(np.asarray(action)[None])
        return (
            batch.obs[0], float(batch.rewards[0]), bool(batch.terminated[0]),
            bool(batch.truncated[0]), batch.infos[0],
        )  # fmt: skip

    def close(self) -> None:
        self._vec.close()
