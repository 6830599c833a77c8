"""PPO's mathematics on chunks: GAE (or V-trace's cut traces) per actor env inside a chunk, and
the clipped surrogate corrected by the workers' behaviour log-probs (decoupled PPO), for either
kind of policy (learner/core/policies.py).

docs/architecture.md (PPO on chunks) says why the clip is centred on the learner's policy.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from clusterenv.learner.core.policies import Policy
from clusterenv.learner.ppo.config import PPOConfig


# --- advantages: GAE over one chunk, env by env -----------------------------------------------
def gae(
    reward: np.ndarray,
    value: np.ndarray,
    next_value: np.ndarray,
    terminated: np.ndarray,
    truncated: np.ndarray,
    env_index: np.ndarray,
    gamma: float,
    lam: float,
    rho: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Advantages and returns (value targets) of one chunk's rows.

    One env's rows of a chunk are consecutive steps in row order, and an episode ends after a row
    that terminated or was truncated (pipeline/chunks/actor.py drops the autoreset steps). So
        δ_t = r_t + γ·V(s'_t)·(1 − terminated_t) − V(s_t)
        A_t = δ_t + γλ·(1 − done_t)·ρ_{t+1}·A_{t+1},   return_t = V(s_t) + ρ_t·A_t
    with ρ ≡ 1 (GAE) unless `rho` gives each row's truncated ratio min(1, π/π_behaviour) (V-trace
    with ρ̄ = c̄ = 1: return_t is its target v_t, and A_t = δ_t + γλ(v_{t+1} − V(s_{t+1})) leaves
    row t's own ratio to the loss, which weights the row by it).
    A truncated row still bootstraps on V(s'_t), its true final observation; a terminated one does
    not; neither carries the next episode's advantage back. The env's last row in the chunk
    bootstraps through V(s'_t) alone (IMPALA's unroll end).
    """
    rho = np.ones(len(reward)) if rho is None else rho
    adv = np.zeros(len(reward), dtype=np.float64)
    delta = reward + gamma * next_value * (1.0 - terminated) - value
    carry = gamma * lam * (1.0 - (terminated | truncated))
    for env in np.unique(env_index):
        following = 0.0  # ρ_{t+1}·A_{t+1} = v_{t+1} − V(s_{t+1})
        for i in np.flatnonzero(env_index == env)[::-1]:
            adv[i] = delta[i] + carry[i] * following
            following = rho[i] * adv[i]
    return adv, value + rho * adv


# --- the loss: clipped surrogate against the behaviour policy -----------------------------------
@dataclass
class LossParts:
    loss: torch.Tensor
    policy_loss: float
    value_loss: float
    entropy: float
    approx_kl: float  # of π_θ from the ratio's centre (behaviour or learner), on this minibatch
    clipfrac: float


def truncated_ratio(logp_learner: torch.Tensor, logp_behaviour: torch.Tensor) -> torch.Tensor:
    """min(1, π_learner(a|s) / π_behaviour(a|s)) per row: IMPALA's ρ̄ = 1, the correction for a
    row sampled by a stale policy (the decoupled loss's row weight, V-trace's trace cut)."""
    return (logp_learner - logp_behaviour).exp().clamp(max=1.0)


def ppo_loss(
    outputs: torch.Tensor,
    values: torch.Tensor,
    mb: dict[str, torch.Tensor],
    cfg: PPOConfig,
    policy: Policy,
) -> LossParts:
    """CleanRL's loss on chunks that may be stale.

    `clip_center == "learner"` (the default): the ratio is taken against `mb["logp_learner"]`,
    the learner's policy at the start of the update, and each row's clipped term is weighted by
    min(1, π_learner / π_behaviour), the behaviour log-prob `mb["logp"]` the worker recorded:
    Hilton et al.'s decoupled objective with IMPALA's truncation. Clipping then bounds how far
    this update moves the learner, whatever the chunk's lag. `"behaviour"`: the ratio against
    `mb["logp"]` (APPO), so the clip bounds the move from the policy that collected the chunk.
    With no lag the two centres are the same policy and so are the losses."""
    logp = policy.log_prob(outputs, mb[policy.column])
    decoupled = cfg.clip_center == "learner"
    log_ratio = logp - (mb["logp_learner"] if decoupled else mb["logp"])
    ratio = log_ratio.exp()
    adv = mb["advantages"]
    if cfg.norm_adv and len(adv) > 1:
        adv = (adv - adv.mean()) / (adv.std() + 1e-8)
    surrogate = torch.max(-adv * ratio, -adv * ratio.clamp(1 - cfg.clip_coef, 1 + cfg.clip_coef))
    if decoupled:
        surrogate = truncated_ratio(mb["logp_learner"], mb["logp"]) * surrogate
    pg_loss = surrogate.mean()
    if cfg.clip_vloss:
        clipped = mb["values"] + (values - mb["values"]).clamp(-cfg.clip_coef, cfg.clip_coef)
        v_loss = (
            0.5 * torch.max((values - mb["returns"]) ** 2, (clipped - mb["returns"]) ** 2).mean()
        )
    else:
        v_loss = 0.5 * ((values - mb["returns"]) ** 2).mean()
    entropy = policy.entropy(outputs).mean()
    loss = pg_loss - cfg.ent_coef * entropy + cfg.vf_coef * v_loss
    with torch.no_grad():
        approx_kl = float(((ratio - 1) - log_ratio).mean())
        clipfrac = float(((ratio - 1.0).abs() > cfg.clip_coef).float().mean())
    scalars = (float(t.detach()) for t in (pg_loss, v_loss, entropy))
    return LossParts(loss, *scalars, approx_kl, clipfrac)
