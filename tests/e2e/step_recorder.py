"""An env that notes which process steps it, by the id "tests.e2e.step_recorder:StepRecorder-v0"
(workers import this module by that id; they run from the repository root, as pytest does)."""

from __future__ import annotations

import os
from typing import Any

import gymnasium as gym
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
