"""How far a worker's policy is from the learner's, measured on the same reference states.

Every measure is a mean over reference states, so a tolerance means the same whatever the number
of envs a worker steps. Which measures exist depends on how workers act: each behaviour kind
(pipeline/behaviour.py) names its own and calls them with its parameters (ε for ε-greedy).

Categorical policies (PPO: outputs are logits, π = softmax):
- `kl` (default): E_s[KL(π_L ‖ π_W)], the quantity PPO's trust region bounds; a ratio-clipped
           update moves the policy by KL ≈ clip²/2 ≈ 0.02 at clip 0.2 (docs/architecture.md).
- `tv`:    E_s[½ Σ_a |π_L − π_W|].

Squashed Gaussian policies (PPO and SAC on Box actions: outputs are d means and d log-stds of u,
the action is tanh(u) scaled to the bounds):
- `kl` (default): E_s[KL(N_L ‖ N_W)] in closed form, on the Gaussians before the squash. tanh and
           the scaling are one invertible map applied to both policies, and KL does not change
           under an invertible map of the variable, so this is exactly the KL between the
           policies the env sees, without sampling; it reads like the categorical `kl`
           (PPO's clip bounds a step to KL ≈ clip²/2 either way).
- `value` (SAC only: it needs the learner's critic): how much the learner's Q changes between the
           learner's greedy action a_L = tanh(μ_L) and the worker's a_W = tanh(μ_W), relative to
           the scale of the learner's values, as DQN's `value` is:
               E_s|Q_L(s, a_W) − Q_L(s, a_L)| / E_s|Q_L(s, a_L)|
           The critic never leaves the learner, so the probe carries, per reference state, a
           second-order model of Q_L(s, ·) around a_L: its value, gradient and diagonal
           curvature (learner/sac/learning.py, by central differences), and the worker takes
           Q_L(s, a_W) − Q_L(s, a_L) ≈ g·δ + ½ Σ_i h_i δ_i², δ = a_W − a_L. A tolerance of 0.01
           fetches once the worker's actions are worth 1 % of the learner's values apart.

ε-greedy policies (DQN: outputs are Q-values):
    π(a|s) = ε/|A| + (1−ε)·[a = argmax_a' Q(s,a')]
- `tv`:    ½ Σ_a |π_L − π_W|. For ε-greedy pairs this is (1−ε) × the rate of greedy-action flips.
- `kl`:    Σ_a π_L log(π_L / π_W), with ε floored at KL_EPS_FLOOR so it stays finite. With two
           actions it is, like `tv`, a function of the flip rate alone.
- `value`: the value lost by acting with the worker's policy, as the learner's own Q sees it,
           relative to the scale of the learner's values:
               E_s[Σ_a (π_L − π_W)(a|s) · Q_L(s,a)] / E_s|max_a Q_L(s,a)|
           A flip on a near-tie state costs almost nothing here; a flip where the learner is sure
           costs its whole action gap. This is the default for Q-based policies.
"""

from __future__ import annotations

import numpy as np

from clusterenv.pipeline.policy import gaussian_params, log_softmax

KL_EPS_FLOOR = 0.01


def behaviour_probs(q: np.ndarray, epsilon: float) -> np.ndarray:
    """ε-greedy action probabilities for each row of Q-values."""
    n, a = q.shape
    probs = np.full((n, a), epsilon / a, dtype=np.float64)
    probs[np.arange(n), q.argmax(axis=1)] += 1.0 - epsilon
    return probs


def tv(q_learner: np.ndarray, q_worker: np.ndarray, epsilon: float) -> float:
    diff = behaviour_probs(q_learner, epsilon) - behaviour_probs(q_worker, epsilon)
    return float(0.5 * np.abs(diff).sum(axis=1).mean())


def kl(q_learner: np.ndarray, q_worker: np.ndarray, epsilon: float) -> float:
    eps = max(epsilon, KL_EPS_FLOOR)
    p, q = behaviour_probs(q_learner, eps), behaviour_probs(q_worker, eps)
    return float((p * np.log(p / q)).sum(axis=1).mean())


def value(q_learner: np.ndarray, q_worker: np.ndarray, epsilon: float) -> float:
    q_l = q_learner.astype(np.float64)
    diff = behaviour_probs(q_l, epsilon) - behaviour_probs(q_worker, epsilon)
    lost = (diff * q_l).sum(axis=1).mean()
    scale = np.abs(q_l.max(axis=1)).mean()
    return float(lost / max(scale, 1e-8))


def categorical_kl(logits_learner: np.ndarray, logits_worker: np.ndarray) -> float:
    """Mean KL(softmax(learner) ‖ softmax(worker))."""
    logp, logq = log_softmax(logits_learner), log_softmax(logits_worker)
    return float((np.exp(logp) * (logp - logq)).sum(axis=1).mean())


def categorical_tv(logits_learner: np.ndarray, logits_worker: np.ndarray) -> float:
    p, q = np.exp(log_softmax(logits_learner)), np.exp(log_softmax(logits_worker))
    return float(0.5 * np.abs(p - q).sum(axis=1).mean())


def squashed_value(probe_learner: np.ndarray, outputs_worker: np.ndarray) -> float:
    """The squashed Gaussians' `value`: the learner's probe rows are its 2d outputs, then Q_L at
    a_L, its d-dimensional gradient and its d diagonal second derivatives there."""
    k = outputs_worker.shape[1]
    d = k // 2
    p = probe_learner.astype(np.float64)
    q0, grad, curv = p[:, k], p[:, k + 1 : k + 1 + d], p[:, k + 1 + d : k + 1 + 2 * d]
    delta = np.tanh(outputs_worker[:, :d].astype(np.float64)) - np.tanh(p[:, :d])
    change = (grad * delta).sum(axis=1) + 0.5 * (curv * delta**2).sum(axis=1)
    return float(np.abs(change).mean() / max(np.abs(q0).mean(), 1e-8))


def gaussian_kl(outputs_learner: np.ndarray, outputs_worker: np.ndarray) -> float:
    """Mean over states of KL(N(μ_L, σ_L) ‖ N(μ_W, σ_W)), diagonal, summed over dimensions."""
    mu_l, log_l = gaussian_params(outputs_learner.astype(np.float64))
    mu_w, log_w = gaussian_params(outputs_worker.astype(np.float64))
    var_l, var_w = np.exp(2 * log_l), np.exp(2 * log_w)
    kl = log_w - log_l + (var_l + (mu_l - mu_w) ** 2) / (2 * var_w) - 0.5
    return float(kl.sum(axis=1).mean())
