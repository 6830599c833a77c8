"""Divergence measures: pure logic on Q-value and logit arrays, no server."""

import numpy as np
import pytest

from clusterenv.pipeline.behaviour import (
    BEHAVIOURS,
    Categorical,
    EpsilonGreedy,
    EpsilonLadder,
    SquashedGaussian,
    StateDependentNoise,
)
from clusterenv.pipeline.policy import log_softmax
from clusterenv.pipeline.sync.divergence import behaviour_probs, categorical_kl, kl, tv, value

RNG = np.random.default_rng(0)
Q = RNG.normal(size=(256, 3)).astype(np.float32) + 5.0


# Every measure of every kind, with the kind's parameters (ε-greedy at three ε).
BEHAVIOURS_AT = {
    "epsilon_greedy": [EpsilonGreedy(0.0), EpsilonGreedy(0.04), EpsilonGreedy(0.5)],
    "epsilon_ladder": [EpsilonLadder(0.4, 7.0, 8), EpsilonLadder(0.4, 7.0, 8).for_actor(1, 4)],
    "categorical": [Categorical()],
    "squashed_gaussian": [SquashedGaussian(), SquashedGaussian(record=False)],
    "gsde": [StateDependentNoise()],
}
MEASURES = [(b, name) for kind in BEHAVIOURS for b in BEHAVIOURS_AT[kind] for name in b.DIVERGENCES]
# A Gaussian policy's outputs: 2 means, then 2 log-stds.
GAUSSIAN = np.concatenate([Q[:, :2] - 5.0, RNG.uniform(-1, 0, (256, 2))], 1).astype(np.float32)


def value_probe(outputs: np.ndarray, grad: np.ndarray, curv: np.ndarray, q0: float = 10.0):
    """A SAC probe for the `value` measure: the outputs, Q_L at a_L, its gradient, curvature."""
    q = np.full((len(outputs), 1), q0)
    return np.concatenate([outputs, q, grad, curv], axis=1).astype(np.float32)


@pytest.mark.parametrize(("behaviour", "name"), MEASURES)
def test_zero_for_identical_and_positive_after_a_change(behaviour, name):
    outputs = GAUSSIAN if isinstance(behaviour, SquashedGaussian) else Q
    probe = outputs
    if isinstance(behaviour, SquashedGaussian) and name == "value":
        probe = value_probe(outputs, RNG.normal(size=(256, 2)), -np.ones((256, 2)))
    assert probe.shape[1] == behaviour.probe_width(name, outputs.shape[1])
    assert behaviour.divergence(name, probe, outputs.copy()) == 0.0
    changed = outputs.copy()
    changed[:64] = changed[:64, ::-1]  # a quarter of the states change their greedy action
    assert behaviour.divergence(name, probe, changed) > 0.0


def test_squashed_value_is_the_quadratic_models_change_relative_to_the_values():
    """For a Q that is exactly quadratic in the action around a_L, the measure is exact:
    mean |g·δ + ½ Σ h δ²| / mean |Q_L(a_L)|, δ = tanh(μ_W) − tanh(μ_L)."""
    grad, curv = RNG.normal(size=(256, 2)), -RNG.uniform(0.5, 2.0, (256, 2))
    probe = value_probe(GAUSSIAN, grad, curv, q0=-50.0)
    worker = GAUSSIAN.copy()
    worker[:, :2] += RNG.normal(scale=0.1, size=(256, 2)).astype(np.float32)
    delta = np.tanh(worker[:, :2].astype(np.float64)) - np.tanh(GAUSSIAN[:, :2].astype(np.float64))
    change = (grad * delta).sum(1) + 0.5 * (curv * delta**2).sum(1)
    expected = np.abs(change).mean() / 50.0
    got = SquashedGaussian(record=False).divergence("value", probe, worker)
    assert got == pytest.approx(expected, rel=1e-5)  # the probe is float32
    # The log-stds do not count: the value is of the greedy actions.
    worker[:, 2:] += 1.0
    assert SquashedGaussian().divergence("value", probe, worker) == pytest.approx(got)


@pytest.mark.parametrize(
    ("behaviour", "name"),
    [(b, n) for b in (EpsilonGreedy(0.1), Categorical()) for n in b.DIVERGENCES],
)
def test_mean_reduced_per_state(behaviour, name):
    other = Q + RNG.normal(scale=1.0, size=Q.shape).astype(np.float32)
    one = behaviour.divergence(name, Q, other)
    tiled = behaviour.divergence(name, np.tile(Q, (8, 1)), np.tile(other, (8, 1)))
    assert tiled == pytest.approx(one, rel=1e-12)


def test_tv_is_the_flip_rate_scaled_by_one_minus_epsilon():
    other = Q + RNG.normal(scale=1.0, size=Q.shape).astype(np.float32)
    flips = float((Q.argmax(1) != other.argmax(1)).mean())
    assert tv(Q, other, 0.2) == pytest.approx(0.8 * flips)


def test_value_divergence_ignores_near_ties_that_tv_counts():
    learner = np.array([[10.0, 10.001], [10.0, 20.0]])
    tie_flip = np.array([[10.001, 10.0], [10.0, 20.0]])  # flips only the near-tie state
    sure_flip = np.array([[10.0, 10.001], [20.0, 10.0]])  # flips the state the learner is sure of
    assert tv(learner, tie_flip, 0.0) == tv(learner, sure_flip, 0.0) == 0.5
    assert value(learner, tie_flip, 0.0) < 1e-4 < 0.3 < value(learner, sure_flip, 0.0)


def test_kl_is_finite_for_greedy_policies():
    other = Q[:, ::-1].copy()
    assert np.isfinite(kl(Q, other, 0.0))


def test_behaviour_probs_sum_to_one():
    p = behaviour_probs(Q, 0.3)
    assert np.allclose(p.sum(1), 1.0) and p.min() == pytest.approx(0.1)


def test_categorical_kl_is_the_softmax_kl_by_hand():
    learner, worker = np.array([[0.0, 1.0, 2.0]]), np.array([[1.0, 0.0, 0.0]])
    p = np.exp(learner[0]) / np.exp(learner[0]).sum()
    q = np.exp(worker[0]) / np.exp(worker[0]).sum()
    assert categorical_kl(learner, worker) == pytest.approx(float((p * np.log(p / q)).sum()))
    # Logits are only defined up to a constant per state: shifting them changes nothing.
    assert categorical_kl(learner + 7.0, worker - 3.0) == pytest.approx(
        categorical_kl(learner, worker)
    )
    assert np.allclose(np.exp(log_softmax(learner)).sum(1), 1.0)


def test_measure_defaults_follow_the_policy_kind():
    assert EpsilonGreedy.measure(None) == "value"
    assert Categorical.measure(None) == "kl"
    assert SquashedGaussian.measure(None) == "kl"
    with pytest.raises(ValueError, match="does not apply to categorical"):
        Categorical.measure("value")


def test_a_learner_without_q_values_is_offered_only_the_measures_it_can_feed():
    # PPO's squashed Gaussian: kl only (tv is for discrete actions, value needs Q-values).
    assert SquashedGaussian.measure(None, q_values=False) == "kl"
    with pytest.raises(ValueError, match=r"needs Q-values \(DQN, SAC\); choose kl$"):
        SquashedGaussian.measure("value", q_values=False)
    with pytest.raises(
        ValueError, match="does not apply to squashed_gaussian policies; choose kl$"
    ):
        SquashedGaussian.measure("tv", q_values=False)
    assert SquashedGaussian.measure("value") == "value"  # SAC's
