"""Stable-Baselines3's VecEnv over remote envs: `PPO("MlpPolicy", RemoteSB3VecEnv("CartPole-v1", 8))`.

Only users import this module (workers and the rest of pipeline never do), so stable-baselines3
stays out of worker installs. The remote envs run SAME_STEP autoreset, which is SB3's convention:
a step that ends an episode returns the next episode's first observation, the last one in
`infos[i]["terminal_observation"]`, and the reset's info in `reset_infos[i]`.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Any

import numpy as np
from gymnasium.envs.registration import EnvSpec
from gymnasium.vector import AutoresetMode

from clusterenv.pipeline.remote_env.vector_env import RemoteVectorEnv

try:
    from stable_baselines3.common.vec_env.base_vec_env import (
        VecEnv,
        VecEnvIndices,
        VecEnvObs,
        VecEnvStepReturn,
    )
except ImportError as exc:  # the message says what to install, not just what is missing
    raise ImportError(
        "clusterenv.pipeline.remote_env.sb3 needs stable-baselines3 (pip install stable-baselines3)"
    ) from exc


class RemoteSB3VecEnv(VecEnv):
    """`num_envs` remote copies of `env_id` (an id or an EnvSpec) as an SB3 VecEnv.

    Arguments are RemoteVectorEnv's (but autoreset_mode). Steps, seeds and infos follow SB3's DummyVecEnv (rewards
    float32, `TimeLimit.truncated`, `terminal_observation`), so the same seeds give the same
    transitions. `get_attr`, `set_attr`, `env_method` and `env_is_wrapped` run on the workers;
    their values travel as JSON and numpy values (anything else arrives as its repr() string).
    Wrap it in SB3's VecMonitor for episode statistics.
    """

    def __init__(self, env_id: str | EnvSpec, num_envs: int, **kwargs: Any):
        if "autoreset_mode" in kwargs:
            raise TypeError("RemoteSB3VecEnv always autoresets SAME_STEP, SB3's convention")
        # The keyword arguments are RemoteVectorEnv's: redis_url, env_kwargs, shards, timeouts.
        self.remote = RemoteVectorEnv(
            env_id, num_envs, autoreset_mode=AutoresetMode.SAME_STEP, **kwargs
        )
        self.actions: np.ndarray | None = None
        try:
            super().__init__(
                num_envs, self.remote.single_observation_space, self.remote.single_action_space
            )
        except BaseException:
            self.remote.close()
            raise

    def reset(self) -> VecEnvObs:
        options = self._options[0]
        if any(o != options for o in self._options):
            raise ValueError("RemoteSB3VecEnv resets every env with the same options")
        batch = self.remote.reset_batch(list(self._seeds), options or None)
        self.reset_infos = [dict(info) for info in batch.infos]
        # Seeds and options are used once, as in DummyVecEnv.
        self._reset_seeds()
        self._reset_options()
        return self.remote.observations(batch)

    def step_async(self, actions: np.ndarray) -> None:
        self.actions = actions

    def step_wait(self) -> VecEnvStepReturn:
        batch = self.remote.step_batch(self.actions)
        dones = batch.terminated | batch.truncated
        infos: list[dict[str, Any]] = []
        for i, info in enumerate(batch.infos):
            if dones[i]:
                # The shard reset this env in the same step: its info is the reset's, carrying
                # the episode's last observation and info.
                reset_info = dict(info)
                terminal_obs = reset_info.pop("final_obs")
                info = {**reset_info.pop("final_info"), "terminal_observation": terminal_obs}
                if reset_info.pop("worker_lost", False):
                    info["worker_lost"] = True
                self.reset_infos[i] = reset_info
            else:
                info = dict(info)
            info["TimeLimit.truncated"] = bool(batch.truncated[i] and not batch.terminated[i])
            infos.append(info)
        rewards = batch.rewards.astype(np.float32)
        return self.remote.observations(batch), rewards, dones, infos

    def close(self) -> None:
        self.remote.close()

    def get_attr(self, attr_name: str, indices: VecEnvIndices = None) -> list[Any]:
        return self.remote.remote_call(
            {"kind": "get", "name": attr_name}, self._get_indices(indices)
        )

    def set_attr(self, attr_name: str, value: Any, indices: VecEnvIndices = None) -> None:
        envs = list(self._get_indices(indices))
        self.remote.remote_call({"kind": "set", "name": attr_name}, envs, [value] * len(envs))

    def env_method(
        self,
        method_name: str,
        *method_args: Any,
        indices: VecEnvIndices = None,
        **method_kwargs: Any,
    ) -> list[Any]:
        request = {
            "kind": "call", "name": method_name, "args": list(method_args), "kwargs": method_kwargs
        }  # fmt: skip
        return self.remote.remote_call(request, self._get_indices(indices))

    def env_is_wrapped(self, wrapper_class: type, indices: VecEnvIndices = None) -> list[bool]:
        # The class travels by name: the worker compares it with each wrapper's classes.
        name = f"{wrapper_class.__module__}:{wrapper_class.__qualname__}"
        return self.remote.remote_call(
            {"kind": "wrapped", "name": name}, self._get_indices(indices)
        )

    def get_images(self) -> Sequence[np.ndarray | None]:
        if self.render_mode != "rgb_array":
            warnings.warn(
                f"The render mode is {self.render_mode}, but get_images() needs 'rgb_array' "
                f"(pass env_kwargs={{'render_mode': 'rgb_array'}})",
                stacklevel=2,
            )
            return [None] * self.num_envs
        return self.env_method("render")
