"""PPO on chunks: decoupled PPO's clipped ratio, corrected by the workers' behaviour log-probs.

Workers act with their cached policy version, sampling from softmax(logits), and send the
log-prob of each action they took (`logp`) with the transitions (pipeline/chunks/runtime.py). The
ingest thread queues whole chunks here (`insert`); `step()` is one PPO update:

1. take whole chunks until `batch_steps` transitions, dropping (and counting) any chunk whose
   policy version lags the newest published one by more than `max_policy_lag`;
2. values from the learner's *current* critic on obs and next_obs; GAE per actor env inside
   each chunk (`gae`): truncation bootstraps on V(final obs), termination does not; with
   `--ppo-advantages vtrace` its trace cut by the truncated ratio π_learner / π_behaviour;
3. `update_epochs` passes of `num_minibatches` Adam steps on `ppo_loss`, whose ratio is
   π_θ(a|s) / π_learner(a|s), the policy at the start of the update, each row weighted by
   π_learner / π_behaviour truncated at 1 with the behaviour log-prob the worker recorded
   (decoupled PPO); `--ppo-clip-center behaviour` takes the ratio against π_behaviour (APPO).

Only the policy network is published (names `layers.{i}.*`, what pipeline.policy.NumpyMLP reads);
the critic stays here. docs/architecture.md (PPO) says why.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn

from clusterenv.learner.config import PPOConfig, hidden_sizes
from clusterenv.learner.dqn import QNetwork, network_tensors, restore_networks
from clusterenv.learner.rate_limiter import RateLimiter
from clusterenv.learner.replay import ReplayBuffer


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


def log_probs(logits: torch.Tensor, action: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """log π(·|s) for every action, and log π(a|s) of the actions taken."""
    logp_all = torch.log_softmax(logits, dim=1)
    return logp_all, logp_all.gather(1, action.unsqueeze(1)).squeeze(1)


def truncated_ratio(logp_learner: torch.Tensor, logp_behaviour: torch.Tensor) -> torch.Tensor:
    """min(1, π_learner(a|s) / π_behaviour(a|s)) per row: IMPALA's ρ̄ = 1, the correction for a
    row sampled by a stale policy (the decoupled loss's row weight, V-trace's trace cut)."""
    return (logp_learner - logp_behaviour).exp().clamp(max=1.0)


def ppo_loss(
    logits: torch.Tensor,
    values: torch.Tensor,
    mb: dict[str, torch.Tensor],
    cfg: PPOConfig,
) -> LossParts:
    """CleanRL's loss on chunks that may be stale.

    `ppo_clip_center == "learner"` (the default): the ratio is taken against `mb["logp_learner"]`,
    the learner's policy at the start of the update, and each row's clipped term is weighted by
    min(1, π_learner / π_behaviour), the behaviour log-prob `mb["logp"]` the worker recorded:
    Hilton et al.'s decoupled objective with IMPALA's truncation. Clipping then bounds how far
    this update moves the learner, whatever the chunk's lag. `"behaviour"`: the ratio against
    `mb["logp"]` (APPO), so the clip bounds the move from the policy that collected the chunk.
    With no lag the two centres are the same policy and so are the losses."""
    logp_all, logp = log_probs(logits, mb["action"])
    decoupled = cfg.ppo_clip_center == "learner"
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
    entropy = -(logp_all.exp() * logp_all).sum(dim=1).mean()
    loss = pg_loss - cfg.ent_coef * entropy + cfg.vf_coef * v_loss
    with torch.no_grad():
        approx_kl = float(((ratio - 1) - log_ratio).mean())
        clipfrac = float(((ratio - 1.0).abs() > cfg.clip_coef).float().mean())
    scalars = (float(t.detach()) for t in (pg_loss, v_loss, entropy))
    return LossParts(loss, *scalars, approx_kl, clipfrac)


# --- the learner ----------------------------------------------------------------------------------
def _init(net: QNetwork, last_std: float) -> QNetwork:
    """CleanRL's orthogonal init: gain √2 inside, `last_std` on the output layer, zero biases."""
    for i, layer in enumerate(net.layers):
        nn.init.orthogonal_(layer.weight, np.sqrt(2) if i < len(net.layers) - 1 else last_std)
        nn.init.constant_(layer.bias, 0.0)
    return net


@dataclass(eq=False)
class QueuedChunk:
    version: int
    arrays: dict[str, np.ndarray]


# What `_prepare` reads of each queued chunk.
_BATCH_COLUMNS = ("obs", "action", "reward", "next_obs", "terminated", "truncated", "env_index",
                  "logp")  # fmt: skip


class PPOLearner:
    """Policy and value MLPs (ReLU: the activation the workers' numpy forward applies), one Adam;
    chunks queued by the ingest thread, one PPO update per `step()`."""

    def __init__(
        self,
        obs_space_shape: tuple[int, ...],
        obs_dtype: np.dtype,
        num_actions: int,
        cfg: PPOConfig,
        limiter: RateLimiter,
        lag_of: Callable[[int], int],
        recent_rows: int,
        seed: int,
    ):
        torch.manual_seed(seed)
        obs_dim, hidden = int(np.prod(obs_space_shape)), hidden_sizes(cfg.ppo_hidden, "ppo-hidden")
        # QNetwork is the plain MLP that NumpyMLP mirrors; here its outputs are logits / a value.
        self.actor = _init(QNetwork(obs_dim, num_actions, hidden), 0.01)
        self.critic = _init(QNetwork(obs_dim, 1, hidden), 1.0)
        self.params = [*self.actor.parameters(), *self.critic.parameters()]
        self.optimizer = torch.optim.Adam(self.params, lr=cfg.ppo_lr, eps=1e-5)
        self.cfg, self.limiter, self.lag_of = cfg, limiter, lag_of
        # Only the newest rows, kept as the pool reference states for probes are drawn from.
        self.replay = ReplayBuffer(recent_rows, obs_space_shape, obs_dtype)
        self.rng = np.random.default_rng(seed)
        self.updates = 0
        self.last_loss = float("nan")
        self.last: LossParts | None = None
        self.dropped_chunks = self.dropped_rows = 0
        self._queue: deque[QueuedChunk] = deque()
        self._queued_rows = 0
        self._lock = threading.Lock()

    def insert(self, header: dict[str, Any], arrays: dict[str, np.ndarray]) -> int:
        """The ingest thread's sink: queue one chunk for the next update."""
        a, rows = arrays, len(arrays["action"])
        self.replay.add(a["obs"], a["action"], a["reward"], a["next_obs"], a["terminated"])
        with self._lock:
            self._queue.append(QueuedChunk(header["policy_version"], arrays))
            self._queued_rows += rows
        self.limiter.on_insert(rows)
        return rows

    def _take_batch(self) -> list[QueuedChunk] | None:
        """Whole chunks of at least `batch_steps` rows, stale ones dropped; None if too few."""
        with self._lock:
            fresh: deque[QueuedChunk] = deque()
            for chunk in self._queue:
                if self.lag_of(chunk.version) <= self.cfg.max_policy_lag:
                    fresh.append(chunk)
                    continue
                rows = len(chunk.arrays["action"])
                self._queued_rows -= rows
                self.dropped_chunks += 1
                self.dropped_rows += rows
                self.limiter.on_sample(rows)  # written off: collection may replace them
            self._queue = fresh
            if self._queued_rows < self.cfg.batch_steps:
                return None
            batch: list[QueuedChunk] = []
            taken = 0
            while taken < self.cfg.batch_steps:
                batch.append(self._queue.popleft())
                taken += len(batch[-1].arrays["action"])
            self._queued_rows -= taken
        self.limiter.on_sample(taken)
        return batch

    def _prepare(self, batch: list[QueuedChunk]) -> dict[str, torch.Tensor]:
        """Rows of the batch with values (current critic), the learner's log-probs (decoupled
        PPO's clip centre, V-trace's target policy), advantages and returns."""
        a = {k: np.concatenate([c.arrays[k] for c in batch]) for k in _BATCH_COLUMNS}
        rows = len(a["action"])
        out = {"action": torch.as_tensor(a["action"]), "logp": torch.as_tensor(a["logp"]).float()}
        out["obs"] = torch.as_tensor(a["obs"]).float().reshape(rows, -1)
        with torch.no_grad():  # one forward of each network over the whole batch
            value = self.critic(out["obs"]).squeeze(1).double().numpy()
            next_obs = torch.as_tensor(a["next_obs"]).float().reshape(rows, -1)
            next_value = self.critic(next_obs).squeeze(1).double().numpy()
            out["logp_learner"] = log_probs(self.actor(out["obs"]), out["action"])[1]
        rho = None
        if self.cfg.ppo_advantages == "vtrace":
            rho = truncated_ratio(out["logp_learner"], out["logp"]).double().numpy()
        reward = a["reward"].astype(np.float64)
        adv, ret = np.empty(rows), np.empty(rows)
        start = 0
        for chunk in batch:  # chunks are never stitched: each is its own set of trajectories
            s = slice(start, start + len(chunk.arrays["action"]))
            adv[s], ret[s] = gae(reward[s], value[s], next_value[s],
                                 a["terminated"][s], a["truncated"][s], a["env_index"][s],
                                 self.cfg.ppo_gamma, self.cfg.gae_lambda,
                                 None if rho is None else rho[s])  # fmt: skip
            start = s.stop
        for name, column in (("values", value), ("advantages", adv), ("returns", ret)):
            out[name] = torch.as_tensor(column).float()
        return out

    def step(self) -> bool:
        """One PPO update if a batch of fresh enough chunks is queued; whether it ran."""
        batch = self._take_batch()
        if batch is None:
            return False
        data = self._prepare(batch)
        rows = len(data["action"])
        for _ in range(self.cfg.update_epochs):
            for idx in np.array_split(self.rng.permutation(rows), self.cfg.num_minibatches):
                mb = {k: v[idx] for k, v in data.items()}
                parts = ppo_loss(
                    self.actor(mb["obs"]), self.critic(mb["obs"]).squeeze(1), mb, self.cfg
                )
                self.optimizer.zero_grad(set_to_none=True)
                parts.loss.backward()
                nn.utils.clip_grad_norm_(self.params, self.cfg.ppo_max_grad_norm)
                self.optimizer.step()
        self.last, self.last_loss = parts, float(parts.loss.detach())
        self.updates += 1
        return True

    def get_weights(self) -> dict[str, np.ndarray]:
        """The policy network only: workers sample from it; the critic never leaves the learner."""
        return self.actor.get_weights()

    def state_tensors(self) -> dict[str, torch.Tensor]:
        return network_tensors({"actor": self.actor, "critic": self.critic})

    def restore(self, tensors: dict[str, torch.Tensor]) -> None:
        """Both networks back from what `state_tensors` returned."""
        restore_networks({"actor": self.actor, "critic": self.critic}, tensors)

    def metrics(self) -> dict[str, float | int | None]:
        last = self.last
        return {
            "losses/policy_loss": last.policy_loss if last else None,
            "losses/value_loss": last.value_loss if last else None,
            "losses/entropy": last.entropy if last else None,
            "losses/approx_kl": last.approx_kl if last else None,
            "losses/clipfrac": last.clipfrac if last else None,
            "pipeline/stale_chunks_dropped": self.dropped_chunks,
            "pipeline/stale_rows_dropped": self.dropped_rows,
        }
