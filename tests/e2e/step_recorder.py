"""Envs that note which process steps them, by ids like "tests.e2e.step_recorder:StepRecorder-v0"
(workers import this module by that id; they run from the repository root, as pytest does)."""

from __future__ import annotations

import os
import time
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.envs.classic_control.cartpole import CartPoleEnv


class StepRecorder(CartPoleEnv):
    """CartPole that appends "pid" to `log_path` the first time each instance is stepped."""

    def __init__(self, log_path: str, **kwargs: Any):
        super().__init__(**kwargs)
        self.log_path, self.logged = log_path, False

    def step(self, action):
        if not self.logged:
            with open(self.log_path, "a") as f:
                f.write(f"{os.getpid()}\n")
            self.logged = True
        return super().step(action)


gym.register("StepRecorder-v0", entry_point=StepRecorder, max_episode_steps=200)


class SlowEval(CartPoleEnv):
    """CartPole whose steps sleep `delay_s`, or `eval_delay_s` in an evaluation episode (seeded from
    EVAL_SEED_BASE up); the first evaluation reset in each process appends its pid to `log_path`.
    With `eval_steps`, an evaluation episode lasts exactly that many steps whatever the policy
    does (the pole is left where it was), so its length does not depend on how far training got."""

    def __init__(
        self, log_path: str, delay_s: float, eval_delay_s: float, eval_steps: int = 0, **kwargs: Any
    ):
        super().__init__(**kwargs)
        self.log_path, self.delay_s, self.eval_delay_s = log_path, delay_s, eval_delay_s
        self.eval_steps, self.eval_stepped = eval_steps, 0
        self.evaluating = False

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        from clusterenv.pipeline.chunks.actor import EVAL_SEED_BASE

        if seed is not None:
            self.evaluating = seed >= EVAL_SEED_BASE
            if self.evaluating:
                with open(self.log_path, "a") as f:
                    f.write(f"{os.getpid()}\n")
        self.eval_stepped = 0
        return super().reset(seed=seed, options=options)

    def step(self, action):
        time.sleep(self.eval_delay_s if self.evaluating else self.delay_s)
        if self.evaluating and self.eval_steps:
            self.eval_stepped += 1
            obs = np.array(self.state, dtype=np.float32)
            return obs, 1.0, False, self.eval_stepped >= self.eval_steps, {}
        return super().step(action)


gym.register("SlowEval-v0", entry_point=SlowEval, max_episode_steps=200)
