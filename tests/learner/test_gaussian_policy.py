"""The squashed Gaussian policy on Box actions: the workers' numpy sampling and log-probs, the
learner's torch log-probs, and APS's KL between two such policies. Pure logic, no server."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from clusterenv.learner.core.policies import SquashedGaussianPolicy
from clusterenv.pipeline.behaviour import SquashedGaussian
from clusterenv.pipeline.policy import sample_squashed_gaussian, squash_log_det
from clusterenv.pipeline.sync.divergence import gaussian_kl


def outputs(rng: np.random.Generator, rows: int, dim: int) -> np.ndarray:
    """Means and log-stds of `rows` states of a `dim`-dimensional policy."""
    return np.concatenate([rng.normal(size=(rows, dim)), rng.uniform(-1.5, 0.5, (rows, dim))], 1)


def test_the_squash_log_det_is_log_one_minus_tanh_squared_and_finite_far_out():
    u = np.array([[-3.0, -0.5, 0.0, 0.7, 2.5]])
    np.testing.assert_allclose(squash_log_det(u), np.log(1 - np.tanh(u) ** 2).sum(axis=1))
    far = squash_log_det(np.array([[40.0], [-40.0]]))
    assert np.isfinite(far).all() and far[0] == pytest.approx(2 * (math.log(2) - 40.0))


def test_worker_samples_and_log_probs_match_torchs_tanh_transformed_gaussian_and_the_learner():
    """The worker's logp is the log-density of tanh(u) under torch's TransformedDistribution of
    the same Gaussian, and the learner's log-prob at the recorded pre-squash sample is the same."""
    rng = np.random.default_rng(0)
    out = outputs(rng, 256, 3)
    actions, logp, u = sample_squashed_gaussian(out, rng)
    assert actions.shape == u.shape == (256, 3) and logp.shape == (256,)
    assert np.abs(actions).max() <= 1.0
    np.testing.assert_allclose(actions, np.tanh(u), atol=1e-6)
    mean, log_std = torch.tensor(out[:, :3]), torch.tensor(out[:, 3:])
    dist = torch.distributions.TransformedDistribution(
        torch.distributions.Normal(mean, log_std.exp()),
        [torch.distributions.TanhTransform(cache_size=1)],
    )
    inside = np.abs(actions).max(axis=1) < 0.999  # where tanh's inverse is well conditioned
    reference = dist.log_prob(torch.tensor(np.tanh(u.astype(np.float64)))).sum(1).numpy()
    np.testing.assert_allclose(logp[inside], reference[inside], rtol=1e-4, atol=1e-4)
    learner = SquashedGaussianPolicy(3).log_prob(torch.tensor(out), torch.tensor(u)).numpy()
    np.testing.assert_allclose(learner, logp, rtol=1e-5, atol=1e-4)


def test_samples_follow_the_gaussian_before_the_squash():
    rng = np.random.default_rng(1)
    out = np.tile([[0.5, -1.0, math.log(0.3), math.log(2.0)]], (20_000, 1))
    actions, extra = SquashedGaussian().act(out, rng)
    u = extra["pre_squash"]
    np.testing.assert_allclose(actions, np.tanh(u), atol=1e-6)
    np.testing.assert_allclose(u.mean(axis=0), [0.5, -1.0], atol=0.05)
    np.testing.assert_allclose(u.std(axis=0), [0.3, 2.0], rtol=0.03)


def test_the_gaussian_kl_is_zero_for_the_same_policy_and_matches_a_monte_carlo_estimate():
    rng = np.random.default_rng(2)
    learner = outputs(rng, 8, 2)
    assert gaussian_kl(learner, learner) == 0.0
    worker = learner + np.concatenate([rng.normal(0, 0.3, (8, 2)), rng.normal(0, 0.2, (8, 2))], 1)
    # E_{u ~ N_L}[log N_L(u) - log N_W(u)], per state, from 200,000 draws.
    mu_l, sd_l = learner[:, :2], np.exp(learner[:, 2:])
    mu_w, sd_w = worker[:, :2], np.exp(worker[:, 2:])
    u = mu_l + sd_l * rng.standard_normal((200_000, 8, 2))

    def logpdf(x: np.ndarray, mu: np.ndarray, sd: np.ndarray) -> np.ndarray:
        return (-0.5 * ((x - mu) / sd) ** 2 - np.log(sd) - 0.5 * math.log(2 * math.pi)).sum(-1)

    estimate = (logpdf(u, mu_l, sd_l) - logpdf(u, mu_w, sd_w)).mean()
    assert gaussian_kl(learner, worker) == pytest.approx(estimate, rel=0.02)
    assert SquashedGaussian().divergence("kl", learner, worker) == gaussian_kl(learner, worker)
