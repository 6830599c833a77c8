"""The policies the learner trains, on the torch side: log π(a|s) at what the workers recorded,
the entropy per state, and (for SAC) a reparametrized draw. The numpy side, which samples on the
workers, is pipeline/policy.py; both clip log-stds to the same range.
"""

from __future__ import annotations

import math

import torch

from clusterenv.pipeline.policy import LOG_STD_MAX, LOG_STD_MIN


class CategoricalPolicy:
    """softmax(logits) over Discrete actions: the network's n outputs are logits."""

    column = "action"  # the batch column log π is taken at

    def __init__(self, n: int):
        self.outputs = n

    def log_prob(self, outputs: torch.Tensor, taken: torch.Tensor) -> torch.Tensor:
        return torch.log_softmax(outputs, dim=1).gather(1, taken.unsqueeze(1)).squeeze(1)

    def entropy(self, outputs: torch.Tensor) -> torch.Tensor:
        logp_all = torch.log_softmax(outputs, dim=1)
        return -(logp_all.exp() * logp_all).sum(dim=1)


class SquashedGaussianPolicy:
    """tanh(N(mean, std)) over Box actions: the network's 2d outputs are d means, then d log-stds
    (clipped as the workers clip them: pipeline/policy.py). log π is taken at the pre-squash
    sample the worker recorded, less the squash's log-det, as the worker computed its `logp`."""

    column = "pre_squash"

    def __init__(self, dim: int):
        self.outputs = 2 * dim

    @staticmethod
    def params(outputs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        mean, log_std = outputs.chunk(2, dim=1)
        return mean, log_std.clamp(LOG_STD_MIN, LOG_STD_MAX)

    def log_prob(self, outputs: torch.Tensor, taken: torch.Tensor) -> torch.Tensor:
        mean, log_std = self.params(outputs)
        z = (taken - mean) / log_std.exp()
        gaussian = (-0.5 * z**2 - log_std - 0.5 * math.log(2 * math.pi)).sum(dim=1)
        log_det = 2.0 * (math.log(2.0) - taken - torch.nn.functional.softplus(-2.0 * taken))
        return gaussian - log_det.sum(dim=1)

    def rsample(self, outputs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """A reparametrized draw (gradients flow to the outputs): tanh(u) in [-1, 1] and its
        log-prob, as the workers' sample_squashed_gaussian computes it."""
        mean, log_std = self.params(outputs)
        u = mean + log_std.exp() * torch.randn_like(mean)
        return torch.tanh(u), self.log_prob(outputs, u)

    def entropy(self, outputs: torch.Tensor) -> torch.Tensor:
        """The squashed policy's, estimated from one reparametrized draw per state (-log π(a|s)):
        it has no closed form, and the Gaussian's alone would reward a wide Gaussian whose tanh
        only ever reaches the bounds."""
        return -self.rsample(outputs)[1]


Policy = CategoricalPolicy | SquashedGaussianPolicy
