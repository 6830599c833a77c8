"""Greedy evaluation: one episode in each of `episodes` envs, acting with argmax Q."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from pipeline.chunks.actor import make_vector_env
from pipeline.policy import NumpyMLP


class Evaluator:
    """Keeps its eval envs between calls; each call runs fresh episodes on new seeds."""

    def __init__(self, env_id: str, env_kwargs: dict[str, Any], episodes: int, seed: int):
        self.envs = make_vector_env(env_id, env_kwargs, episodes)
        self.episodes = episodes
        self.seed = seed
        self.calls = 0

    def run(self, weights: Mapping[str, np.ndarray]) -> np.ndarray:
        """Undiscounted returns of `episodes` greedy episodes."""
        policy = NumpyMLP(weights)
        n = self.episodes
        obs, _ = self.envs.reset(seed=[self.seed + self.calls * n + i for i in range(n)])
        self.calls += 1
        returns = np.zeros(n)
        running = np.ones(n, dtype=bool)
        while running.any():
            obs, reward, terminated, truncated, _ = self.envs.step(policy(obs).argmax(axis=1))
            returns += np.where(running, reward, 0.0)
            running &= ~(terminated | truncated)
        return returns

    def close(self) -> None:
        self.envs.close()
