"""SAC: an actor, twin Q critics and their Polyak targets, and the entropy coefficient, trained on
minibatches from replay.

`SACLearner.step()` is one update on a minibatch sampled from replay, when the rate limiter
allows it (as DQN's); `update(batch)` is the mathematics alone, as Stable-Baselines3's SAC does
it (Haarnoja et al. 2018, automatic entropy tuning):

1. the entropy coefficient α = exp(log α) moves so the policy's entropy tracks the target (the
   rest of the update uses α as it was before);
2. each critic regresses Q(s, a) on r + γ (1 − terminated) (min of the target critics at
   (s', a') − α log π(a'|s')), a' drawn from the actor at s';
3. the actor minimizes α log π(a|s) − min(Q1, Q2)(s, a) over reparametrized draws a;
4. the target critics move `tau` towards the critics.

Actions are the env's (replay keeps what the workers sent, within the Box bounds) and the critics
take them scaled to [-1, 1], the space the actor's tanh acts in. Only the actor is published (the
weight-name contract of pipeline/policy.py: `layers.{i}.*` with d means, then d log-stds out;
with --gsde the last layer gives the means and `sde.log_std` the state-dependent stds); the
critics stay here.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
from torch import nn

from clusterenv.learner.core.agent import State
from clusterenv.learner.core.networks import (
    CPU,
    MLP,
    SDEActor,
    hidden_sizes,
    network_arrays,
    optimizer_arrays,
    restore_networks,
    restore_optimizer,
)
from clusterenv.learner.core.policies import SquashedGaussianPolicy
from clusterenv.learner.replay.rate_limiter import RateLimiter
from clusterenv.learner.replay.saved import restore_replay, save_replay
from clusterenv.learner.replay.uniform import ReplayBuffer
from clusterenv.learner.sac.config import SACConfig
from clusterenv.pipeline.spaces import BoxActions

# The action step of the critics' central differences for APS's `value` measure, in the actor's
# [-1, 1] units: small against the actions' range, large against float32 rounding of Q.
VALUE_STEP = 0.05


class SACLearner:
    """Actor, twin critics with targets, log α; three Adams; replay and the rate limiter."""

    def __init__(
        self,
        obs_dim: int,
        actions: BoxActions,
        cfg: SACConfig,
        replay: ReplayBuffer,
        limiter: RateLimiter,
        seed: int,
        save_replay: bool = False,
        device: torch.device = CPU,
    ):
        torch.manual_seed(seed)
        hidden, dim = hidden_sizes(cfg.hidden), actions.dim
        self.device, self.policy = device, SquashedGaussianPolicy(dim)
        self.actor = (SDEActor(obs_dim, dim, hidden, cfg.log_std_init) if cfg.gsde
                      else MLP(obs_dim, 2 * dim, hidden)).to(device)  # fmt: skip
        self.critics = nn.ModuleList(MLP(obs_dim + dim, 1, hidden) for _ in range(2)).to(device)
        self.targets = nn.ModuleList(MLP(obs_dim + dim, 1, hidden) for _ in range(2)).to(device)
        self.targets.load_state_dict(self.critics.state_dict())
        self.targets.requires_grad_(False)
        self.log_alpha = torch.tensor(float(np.log(cfg.init_alpha)), device=device).requires_grad_()
        self.target_entropy = -float(dim) if cfg.target_entropy is None else cfg.target_entropy
        # Fused Adam (as DQN's): one kernel over all of a net's parameters, ~4x faster a step
        # on a 256-256 critic pair than the per-tensor loop, where Adam was 13 % of an update.
        self.optimizers = {
            "actor": torch.optim.Adam(self.actor.parameters(), lr=cfg.lr, fused=True),
            "critic": torch.optim.Adam(self.critics.parameters(), lr=cfg.lr, fused=True),
            "alpha": torch.optim.Adam([self.log_alpha], lr=cfg.lr, fused=True),
        }
        # The env's bounds, to scale replay's actions into the actor's [-1, 1].
        low, high = np.array(actions.low), np.array(actions.high)
        self.center = torch.tensor((high + low) / 2, dtype=torch.float32, device=device)
        self.half = torch.tensor((high - low) / 2, dtype=torch.float32, device=device)
        self.cfg, self.replay, self.limiter, self.save_replay = cfg, replay, limiter, save_replay
        self.rng = np.random.default_rng(seed)
        self.updates = 0
        self.last: dict[str, float] = {}

    def insert(self, header: dict[str, Any], arrays: Mapping[str, np.ndarray]) -> int:
        """The ingest thread's sink: a chunk's transitions into replay."""
        rows = self.replay.insert(arrays)
        self.limiter.on_insert(rows)
        return rows

    def step(self) -> bool:
        """One update on a replay minibatch if the rate limiter allows one; whether it ran."""
        if not self.limiter.can_sample(self.cfg.batch_size):
            return False
        self.update(self.replay.sample(self.cfg.batch_size, self.rng))
        self.limiter.on_sample(self.cfg.batch_size)
        return True

    def _q(self, nets: nn.ModuleList, obs: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
        """The smaller of the two nets' Q(s, a), a per row."""
        x = torch.cat([obs, action], dim=1)
        return torch.min(nets[0](x), nets[1](x)).squeeze(1)

    def update(self, batch: Mapping[str, np.ndarray]) -> dict[str, float]:
        """One SAC update on `batch`; its losses and α."""
        obs, next_obs, action, reward, terminated = (
            torch.from_numpy(batch[name]).to(self.device)
            for name in ("obs", "next_obs", "action", "reward", "terminated")
        )
        n = len(obs)
        obs, next_obs = obs.float().reshape(n, -1), next_obs.float().reshape(n, -1)
        action = (action.reshape(n, -1) - self.center) / self.half
        # 1. α, on draws from the current actor; this update uses the α before the step (SB3).
        # A gSDE actor's draws are independent per row where SB3 shares one noise matrix over
        # the minibatch: each row's Gaussian is the same, so are the losses' expectations.
        new_action, logp = self.policy.rsample(self.actor(obs))
        alpha = self.log_alpha.detach().exp()
        alpha_loss = -(self.log_alpha * (logp.detach() + self.target_entropy)).mean()
        if self.cfg.learn_alpha:
            self._step("alpha", alpha_loss)
        # 2. The critics, towards the soft Bellman target of the target critics.
        with torch.no_grad():
            next_action, next_logp = self.policy.rsample(self.actor(next_obs))
            soft = self._q(self.targets, next_obs, next_action) - alpha * next_logp
            target = reward + self.cfg.gamma * (1.0 - terminated.float()) * soft
        x = torch.cat([obs, action], dim=1)
        critic_loss = sum(0.5 * ((q(x).squeeze(1) - target) ** 2).mean() for q in self.critics)
        self._step("critic", critic_loss)
        # 3. The actor, through the critics. Their weights are frozen for this loss: only the
        # actor steps on it, and the critics' own weight gradients (a third of their backward)
        # would be computed to be thrown away. The action's gradient flows through them as before.
        self.critics.requires_grad_(False)
        try:
            actor_loss = (alpha * logp - self._q(self.critics, obs, new_action)).mean()
            self._step("actor", actor_loss)
        finally:
            self.critics.requires_grad_(True)
        # 4. Polyak averaging of the targets.
        with torch.no_grad():
            for t, c in zip(self.targets.parameters(), self.critics.parameters(), strict=True):
                t.lerp_(c, self.cfg.tau)
        self.updates += 1
        losses = {"critic_loss": critic_loss, "actor_loss": actor_loss, "alpha_loss": alpha_loss}
        self.last = {f"losses/{k}": float(v.detach()) for k, v in losses.items()}
        self.last |= {
            "learner/alpha": float(alpha),
            "learner/entropy": float(-logp.detach().mean()),
        }
        return self.last

    def _step(self, name: str, loss: torch.Tensor) -> None:
        opt = self.optimizers[name]
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    def collected(self, env_steps: int) -> None:
        """Nothing follows collection: the learning rate is constant."""

    @torch.no_grad()
    def value_model(self, states: np.ndarray, outputs: np.ndarray) -> np.ndarray:
        """Per state, what APS's `value` measure needs of the critics (pipeline/sync/divergence.py):
        Q(s, a) at the actor's greedy action a = tanh(mean), where `outputs` are the published
        actor's on `states`, then its gradient and diagonal second derivatives in a, by central
        differences of VALUE_STEP (2d + 1 evaluations of the smaller critic per state)."""
        d, rows = self.half.shape[0], len(states)
        obs = torch.as_tensor(states.reshape(rows, -1), dtype=torch.float32, device=self.device)
        greedy = torch.tanh(torch.as_tensor(outputs[:, :d], dtype=torch.float32,
                                            device=self.device))  # fmt: skip
        steps = VALUE_STEP * torch.cat([torch.zeros(1, d), torch.eye(d), -torch.eye(d)])
        actions = greedy[None] + steps[:, None].to(self.device)  # (2d + 1, rows, d)
        q = self._q(self.critics, obs.repeat(2 * d + 1, 1), actions.reshape(-1, d))
        q = q.reshape(2 * d + 1, rows).double()
        plus, minus = q[1 : d + 1], q[d + 1 :]
        grad = (plus - minus) / (2 * VALUE_STEP)
        curv = (plus + minus - 2 * q[0]) / VALUE_STEP**2
        return torch.cat([q[:1], grad, curv]).T.float().cpu().numpy()

    def get_weights(self) -> dict[str, np.ndarray]:
        """The actor only: workers sample from it; the critics never leave the learner."""
        return self.actor.get_weights()

    def metrics(self) -> dict[str, float | int | None]:
        return {**self.last, "learner/replay_size": self.replay.size}

    def networks(self) -> dict[str, nn.Module]:
        """The networks by the prefix their parameters carry in checkpoints (`actor.` is what
        `clusterenv eval` acts with)."""
        return {"actor": self.actor, "critics": self.critics, "targets": self.targets}

    def save(self) -> State:
        """The networks, log α, the three optimizers, the generators and counters; replay's
        rows and the limiter's counts with `save_replay` (as DQN's)."""
        arrays = network_arrays(self.networks())
        arrays["log_alpha"] = self.log_alpha.detach().cpu().numpy().reshape(1).copy()
        groups = {}
        for name, opt in self.optimizers.items():
            optim, groups[name] = optimizer_arrays(opt)
            # Not under the network's own prefix (`actor.`): restore_networks reads those.
            arrays.update({f"adam_{name}.{key}": value for key, value in optim.items()})
        arrays["rng.torch"] = torch.get_rng_state().numpy()
        values: dict[str, Any] = {"updates": self.updates, "optimizers": groups,
                                  "rng": self.rng.bit_generator.state, "replay": None}  # fmt: skip
        if self.save_replay:
            save_replay(self.replay, self.limiter, arrays, values)
        return arrays, values

    def restore(self, arrays: Mapping[str, np.ndarray], values: Mapping[str, Any]) -> None:
        """Take back what `save` returned."""
        restore_networks(self.networks(), arrays)
        with torch.no_grad():
            self.log_alpha.copy_(torch.as_tensor(arrays["log_alpha"]).reshape(()))
        for name, opt in self.optimizers.items():
            mine = {k.removeprefix(f"adam_{name}."): v for k, v in arrays.items()
                    if k.startswith(f"adam_{name}.")}  # fmt: skip
            restore_optimizer(opt, mine, values["optimizers"][name])
        torch.set_rng_state(torch.as_tensor(arrays["rng.torch"]))
        self.rng.bit_generator.state = values["rng"]
        self.updates = values["updates"]
        restore_replay(self.replay, self.limiter, arrays, values)
