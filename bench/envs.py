"""Envs the benchmarks build on workers by id, e.g. "bench.envs:SlowCartPole-v1"."""

from __future__ import annotations

import time
from typing import Any

import gymnasium as gym


class SlowStep(gym.Wrapper):
    """Sleeps `delay_s` per step: a stand-in for an expensive simulator that leaves the CPU idle."""

    def __init__(self, env: gym.Env, delay_s: float = 0.001):
        super().__init__(env)
        self.delay_s = delay_s

    def step(self, action: Any):
        time.sleep(self.delay_s)
        return self.env.step(action)


def _slow_cartpole(delay_s: float = 0.001, **kwargs: Any) -> gym.Env:
    return SlowStep(gym.make("CartPole-v1", **kwargs), delay_s)


gym.register("SlowCartPole-v1", entry_point=_slow_cartpole)
SLOW_CARTPOLE = "bench.envs:SlowCartPole-v1"
