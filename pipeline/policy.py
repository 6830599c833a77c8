"""The acting side of a published network: a numpy MLP, and the two ways workers act with it.

Workers act with numpy rather than torch: for CartPole-sized nets it is faster per step and keeps
torch out of the worker's hot loop. Weight names follow `layers.{i}.weight` / `layers.{i}.bias`,
as the learner's `MLP.get_weights` (learner/core/networks.py) writes them (for PPO, of its policy network).
The outputs are Q-values (DQN: act ε-greedily) or logits (PPO: sample the categorical policy);
which one a chunk uses is its behaviour value (pipeline/behaviour.py).
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from clusterenv.pipeline.codec import decode_weights


class NumpyMLP:
    """Linear layers with ReLU between them; the last layer's outputs are Q-values or logits."""

    def __init__(self, weights: Mapping[str, np.ndarray]):
        """Layers from `layers.{i}.weight` / `.bias`; ValueError names the first one that does not fit."""
        count = 0
        while f"layers.{count}.weight" in weights:
            count += 1
        if count == 0:
            raise ValueError("weights hold no 'layers.0.weight'")
        self.layers = [_layer(weights, i) for i in range(count)]
        for i in range(1, count):
            if self.layers[i][0].shape[0] != self.layers[i - 1][1].shape[0]:
                raise ValueError(
                    f"layers.{i}.weight takes {self.layers[i][0].shape[0]} inputs, "
                    f"layers.{i - 1} gives {self.layers[i - 1][1].shape[0]}"
                )

    @property
    def num_inputs(self) -> int:
        return self.layers[0][0].shape[0]

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


def _layer(weights: Mapping[str, np.ndarray], i: int) -> tuple[np.ndarray, np.ndarray]:
    """(weight transposed, bias) of layer `i`, checked: finite floats, a (out, in) matrix, (out,) bias."""
    w, b = weights[f"layers.{i}.weight"], weights.get(f"layers.{i}.bias")
    if b is None:
        raise ValueError(f"layers.{i}.bias is missing")
    for name, a, ndim in ((f"layers.{i}.weight", w, 2), (f"layers.{i}.bias", b, 1)):
        if a.dtype.kind != "f" or a.ndim != ndim or 0 in a.shape:
            raise ValueError(f"{name}: {a.dtype} {a.shape} is not a non-empty {ndim}-d float array")
        if not np.isfinite(a).all():
            raise ValueError(f"{name} has non-finite values")
    if b.shape[0] != w.shape[0]:
        raise ValueError(f"layers.{i}.bias has {b.shape[0]} values for {w.shape[0]} outputs")
    return np.ascontiguousarray(w.T, dtype=np.float32), np.asarray(b, dtype=np.float32)


def load_policy(blob: bytes) -> NumpyMLP:
    """The policy in a safetensors blob; ValueError (CodecError for the bytes) names what is wrong."""
    return NumpyMLP(decode_weights(blob))


def epsilon_greedy(q_values: np.ndarray, epsilon: float, rng: np.random.Generator) -> np.ndarray:
    """Greedy actions, each replaced by a uniform one with probability epsilon."""
    actions = q_values.argmax(axis=1)
    if epsilon > 0.0:
        explore = rng.random(len(actions)) < epsilon
        if explore.any():
            actions[explore] = rng.integers(q_values.shape[1], size=int(explore.sum()))
    return actions


def log_softmax(logits: np.ndarray) -> np.ndarray:
    """Log-probabilities of the categorical policy of each row of logits (float64, stable)."""
    x = np.asarray(logits, dtype=np.float64)
    x = x - x.max(axis=1, keepdims=True)
    return x - np.log(np.exp(x).sum(axis=1, keepdims=True))


def sample_categorical(
    logits: np.ndarray, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """One action per row drawn from softmax(logits), and its log-probability (the behaviour
    log-prob PPO's ratio is taken against)."""
    logp = log_softmax(logits)
    cdf = np.exp(logp).cumsum(axis=1)
    u = rng.random((len(cdf), 1)) * cdf[:, -1:]  # scaled by the row sum: rounding never overshoots
    actions = (cdf <= u).sum(axis=1).clip(max=logp.shape[1] - 1)
    return actions.astype(np.int64), logp[np.arange(len(actions)), actions].astype(np.float32)
