"""Envs the benchmarks build on workers by id, e.g. "bench.envs:SlowCartPole-v1"."""

from __future__ import annotations

import time
from typing import Any

import gymnasium as gym
import numpy as np


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


def _slow_minatar_breakout(delay_s: float = 0.002, **kwargs: Any) -> gym.Env:
    from clusterenv.pipeline.envs.make import make_env

    # MinAtar's envs are the same in training and evaluation (pipeline/envs/minatar.py).
    return SlowStep(make_env("MinAtar/Breakout-v1", kwargs, training=True), delay_s)


# Issue 30's expensive pixel env. Its id keeps MinAtar's family, so `clusterenv train` takes the
# MinAtar preset for "bench.envs:MinAtar/SlowBreakout-v1" and SB3 the same settings and torso.
gym.register("MinAtar/SlowBreakout-v1", entry_point=_slow_minatar_breakout)
SLOW_MINATAR_BREAKOUT = "bench.envs:MinAtar/SlowBreakout-v1"


def _slow_pendulum(delay_s: float = 0.004, **kwargs: Any) -> gym.Env:
    return SlowStep(gym.make("Pendulum-v1", **kwargs), delay_s)


# Issue 33's expensive continuous env. A namespaced id takes its base name's preset, so both
# systems run Pendulum-v1's SAC preset on it (learner/tools/presets.py).
gym.register("Slow/Pendulum-v1", entry_point=_slow_pendulum)
SLOW_PENDULUM = "bench.envs:Slow/Pendulum-v1"


class SimulatedCrash(RuntimeError):
    """What a Flaky env raises."""


class Flaky(gym.Wrapper):
    """An env that fails as users' simulators do (RLlib's CartPoleCrashing, issue 31's rates):
    `reset` raises with probability `reset_crash_p`, a step raises with `step_crash_p`, and a
    step stalls for a time drawn from `stall_s` (low, high) with `stall_p`. Faults draw from their
    own random stream, seeded by `fault_seed` (None: fresh entropy, so an env built anew fails
    elsewhere than the one before it)."""

    def __init__(
        self,
        env: gym.Env,
        step_crash_p: float = 0.0,
        reset_crash_p: float = 0.0,
        stall_p: float = 0.0,
        stall_s: tuple[float, float] = (2.0, 5.0),
        fault_seed: int | None = None,
    ):
        super().__init__(env)
        self.step_crash_p, self.reset_crash_p = step_crash_p, reset_crash_p
        self.stall_p, self.stall_s = stall_p, tuple(stall_s)
        self.faults = np.random.default_rng(fault_seed)

    def reset(self, **kwargs: Any):
        if self.faults.random() < self.reset_crash_p:
            raise SimulatedCrash("simulated crash in reset")
        return self.env.reset(**kwargs)

    def step(self, action: Any):
        if self.faults.random() < self.stall_p:
            time.sleep(self.faults.uniform(*self.stall_s))
        if self.faults.random() < self.step_crash_p:
            raise SimulatedCrash("simulated crash in step")
        return self.env.step(action)


def _flaky_cartpole(
    step_crash_p: float = 0.0,
    reset_crash_p: float = 0.0,
    stall_p: float = 0.0,
    stall_s: tuple[float, float] = (2.0, 5.0),
    fault_seed: int | None = None,
    **kwargs: Any,
) -> gym.Env:
    env = gym.make("CartPole-v1", **kwargs)
    return Flaky(env, step_crash_p, reset_crash_p, stall_p, stall_s, fault_seed)


gym.register("FlakyCartPole-v1", entry_point=_flaky_cartpole, reward_threshold=475.0)
FLAKY_CARTPOLE = "bench.envs:FlakyCartPole-v1"
# Issue 31's rates: a crash per 10,000 steps and per 1,000 resets, a 2-5 s stall per 2,000 steps.
FLAKY_RATES = {"step_crash_p": 1e-4, "reset_crash_p": 1e-3, "stall_p": 5e-4, "stall_s": [2.0, 5.0]}
