"""The acting side of a Q-network: a numpy MLP built from published weights, used by workers and eval.

Workers act with numpy rather than torch: for CartPole-sized nets it is faster per step and keeps
torch out of the worker's hot loop. Weight names follow `layers.{i}.weight` / `layers.{i}.bias`,
as `clusterenv.learner.dqn.QNetwork.get_weights` writes them.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np


class NumpyMLP:
    """Linear layers with ReLU between them; the last layer's outputs are Q-values or logits."""

    def __init__(self, weights: Mapping[str, np.ndarray]):
        count = 0
        while f"layers.{count}.weight" in weights:
            count += 1
        if count == 0:
            raise ValueError("weights hold no 'layers.0.weight'")
        self.layers = [
            (
                np.ascontiguousarray(weights[f"layers.{i}.weight"].T, dtype=np.float32),
                np.asarray(weights[f"layers.{i}.bias"], dtype=np.float32),
            )
            for i in range(count)
        ]

    @property
    def num_outputs(self) -> int:
        return self.layers[-1][1].shape[0]

    def __call__(self, obs: np.ndarray) -> np.ndarray:
        x = np.asarray(obs, dtype=np.float32).reshape(len(obs), -1)
        last = len(self.layers) - 1
        for i, (w_t, b) in enumerate(self.layers):
            x = x @ w_t
            x += b
            if i < last:
                np.maximum(x, 0.0, out=x)
        return x


def epsilon_greedy(q_values: np.ndarray, epsilon: float, rng: np.random.Generator) -> np.ndarray:
    """Greedy actions, each replaced by a uniform one with probability epsilon."""
    actions = q_values.argmax(axis=1)
    if epsilon > 0.0:
        explore = rng.random(len(actions)) < epsilon
        if explore.any():
            actions[explore] = rng.integers(q_values.shape[1], size=int(explore.sum()))
    return actions
