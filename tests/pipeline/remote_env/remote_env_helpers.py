"""Envs the remote-env tests build on workers, by the id "tests.pipeline.remote_env.remote_env_helpers:NAME".

Workers import this module by that id (gymnasium imports the part before the colon), which works
because the test workers run from the repository root, as pytest does.
"""

from __future__ import annotations

import time
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.envs.classic_control.cartpole import CartPoleEnv


class FlakyCartPole(CartPoleEnv):
    """CartPole that raises once, at step `fail_at` after a reset with seed `fail_seed`."""

    def __init__(self, fail_seed: int = -1, fail_at: int = 3, **kwargs: Any):
        super().__init__(**kwargs)
        self.fail_seed, self.fail_at = fail_seed, fail_at
        self.armed, self.t = False, 0

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        if seed is not None:
            self.armed = seed == self.fail_seed
        self.t = 0
        return super().reset(seed=seed, options=options)

    def step(self, action):
        self.t += 1
        if self.armed and self.t == self.fail_at:
            self.armed = False
            raise RuntimeError(f"boom at step {self.t}")
        return super().step(action)


class TaggedEnv(gym.Env):
    """Observes [its reset seed, its step count]; sleeps `delay_s` per step when seed < `slow_below`.

    Lets a test see which env answered in which column, and make the first shard the last to answer.
    """

    observation_space = gym.spaces.Box(-np.inf, np.inf, shape=(2,), dtype=np.float64)
    action_space = gym.spaces.Discrete(2)

    def __init__(self, slow_below: int = -1, delay_s: float = 0.0):
        self.slow_below, self.delay_s = slow_below, delay_s
        self.seed_seen, self.t = -1, 0

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        if seed is not None:
            self.seed_seen = seed
        self.t = 0
        return np.array([self.seed_seen, 0.0]), {"seed": self.seed_seen}

    def step(self, action):
        if self.seed_seen < self.slow_below:
            time.sleep(self.delay_s)
        self.t += 1
        obs = np.array([self.seed_seen, float(self.t)])
        return obs, 1.0, False, self.t >= 5, {"t": np.int64(self.t)}


class SpacesEnv(gym.Env):
    """Dict and Tuple spaces, nested, for observations and actions; numpy-scalar rewards, 5 steps."""

    observation_space = gym.spaces.Dict(
        {
            "pos": gym.spaces.Box(-1.0, 1.0, shape=(2,), dtype=np.float32),
            "t": gym.spaces.Discrete(6),
            "nested": gym.spaces.Tuple(
                (gym.spaces.MultiBinary(3), gym.spaces.Box(0, 255, (2, 2), np.uint8))
            ),
        }
    )
    action_space = gym.spaces.Tuple(
        (gym.spaces.Discrete(3), gym.spaces.Box(-1.0, 1.0, shape=(1,), dtype=np.float32))
    )

    def _obs(self) -> dict[str, Any]:
        r = self.np_random
        nested = (r.integers(0, 2, 3, dtype=np.int8), r.integers(0, 256, (2, 2), dtype=np.uint8))
        pos = r.uniform(-1, 1, 2).astype(np.float32)
        return {"pos": pos, "t": self.t, "nested": nested}

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        self.t = 0
        return self._obs(), {"start": True}

    def step(self, action):
        choice, push = action
        self.t += 1
        reward = np.float32(int(choice) + float(push[0]))
        return self._obs(), reward, self.t >= 5, False, {"choice": int(choice)}


class DictObsEnv(gym.Env):
    """A flat Dict observation and Discrete actions, as SB3's MultiInputPolicy takes; 8 steps."""

    observation_space = gym.spaces.Dict(
        {
            "pos": gym.spaces.Box(-1.0, 1.0, shape=(2,), dtype=np.float32),
            "t": gym.spaces.Discrete(9),
        }
    )
    action_space = gym.spaces.Discrete(2)

    def _obs(self) -> dict[str, Any]:
        return {"pos": self.np_random.uniform(-1, 1, 2).astype(np.float32), "t": self.t}

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        self.t = 0
        return self._obs(), {}

    def step(self, action):
        self.t += 1
        return self._obs(), float(action), self.t >= 8, False, {}


gym.register("RemoteTestSpaces-v0", entry_point=SpacesEnv)
# A 'module:Name' entry point, so that gym.make(...).spec can travel as JSON.
gym.register("RemoteTestDictObs-v0", entry_point=f"{__name__}:DictObsEnv")
gym.register("RemoteTestFlaky-v0", entry_point=FlakyCartPole, max_episode_steps=500)
gym.register("RemoteTestTagged-v0", entry_point=TaggedEnv, disable_env_checker=True)
