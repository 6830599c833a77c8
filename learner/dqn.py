"""Double DQN: a Q-network, its target copy, and one gradient step on a replay minibatch.

`DQNLearner.step()` is one update on a minibatch sampled from replay, when the rate limiter
allows it; `update(batch)` is the math alone.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
from torch import nn

from clusterenv.learner.config import DQNConfig
from clusterenv.learner.rate_limiter import RateLimiter
from clusterenv.learner.replay import ReplayBuffer


class QNetwork(nn.Module):
    """MLP from observations to one Q-value per action."""

    def __init__(self, obs_dim: int, num_actions: int, hidden: list[int]):
        super().__init__()
        sizes = [obs_dim, *hidden, num_actions]
        self.layers = nn.ModuleList(
            nn.Linear(a, b) for a, b in zip(sizes[:-1], sizes[1:], strict=True)
        )

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        x = obs.reshape(len(obs), -1)
        for layer in self.layers[:-1]:
            x = torch.relu(layer(x))
        return self.layers[-1](x)

    def get_weights(self) -> dict[str, np.ndarray]:
        """Numpy copies named `layers.{i}.weight|bias`, the names clusterenv.pipeline.policy.NumpyMLP reads."""
        return {k: v.detach().cpu().numpy().copy() for k, v in self.state_dict().items()}


class DQNLearner:
    """Online and target Q-networks with Adam, trained on minibatches from replay."""

    def __init__(
        self,
        obs_dim: int,
        num_actions: int,
        cfg: DQNConfig,
        replay: ReplayBuffer,
        limiter: RateLimiter,
        seed: int,
    ):
        torch.manual_seed(seed)
        hidden = cfg.hidden_sizes()
        self.q = QNetwork(obs_dim, num_actions, hidden)
        self.target = QNetwork(obs_dim, num_actions, hidden)
        self.target.load_state_dict(self.q.state_dict())
        self.target.requires_grad_(False)
        self.optimizer = torch.optim.Adam(self.q.parameters(), lr=cfg.lr, fused=True)
        self.cfg, self.replay, self.limiter = cfg, replay, limiter
        self.rng = np.random.default_rng(seed)
        self.updates = 0
        self.last_loss = float("nan")
        self._params = list(self.q.parameters())

    def insert(self, header: dict[str, Any], arrays: Mapping[str, np.ndarray]) -> int:
        """The ingest thread's sink: a chunk's transitions into replay; the rows inserted."""
        a = arrays
        self.replay.add(a["obs"], a["action"], a["reward"], a["next_obs"], a["terminated"])
        rows = len(a["action"])
        self.limiter.on_insert(rows)
        return rows

    def step(self) -> bool:
        """One update on a replay minibatch if the rate limiter allows one; whether it ran."""
        if not self.limiter.can_sample(self.cfg.batch_size):
            return False
        batch = self.replay.sample(self.cfg.batch_size, self.rng)
        self.last_loss = self.update(batch)
        self.limiter.on_sample(self.cfg.batch_size)
        return True

    def update(self, batch: Mapping[str, np.ndarray]) -> float:
        """One Double-DQN gradient step on `batch`; returns the Huber TD loss."""
        obs = torch.from_numpy(batch["obs"]).float()
        next_obs = torch.from_numpy(batch["next_obs"]).float()
        action = torch.from_numpy(batch["action"])
        reward = torch.from_numpy(batch["reward"])
        terminated = torch.from_numpy(batch["terminated"])
        # Double DQN: the online net picks the next action, the target net values it. No autograd
        # there, and the backward pass then runs over the batch, not batch + next states
        # (bench/update_cost.py: 1.5 -> 1.3 ms per step here).
        with torch.inference_mode():
            if self.cfg.double:
                next_action = self.q(next_obs).argmax(dim=1, keepdim=True)
                next_q = self.target(next_obs).gather(1, next_action).squeeze(1)
            else:
                next_q = self.target(next_obs).max(dim=1).values
            td_target = reward + self.cfg.gamma * (1.0 - terminated) * next_q
        q_taken = self.q(obs).gather(1, action.unsqueeze(1)).squeeze(1)
        # An inference-mode tensor cannot be saved for backward: the loss gets a normal copy.
        loss = nn.functional.smooth_l1_loss(q_taken, td_target.clone())
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        nn.utils.clip_grad_norm_(self._params, self.cfg.max_grad_norm, foreach=True)
        self.optimizer.step()
        self.updates += 1
        if self.updates % self.cfg.target_update_every == 0:
            self.target.load_state_dict(self.q.state_dict())
        return float(loss.detach())

    def get_weights(self) -> dict[str, np.ndarray]:
        return self.q.get_weights()

    def metrics(self) -> dict[str, float | int | None]:
        return {"losses/td_loss": self.last_loss, "learner/replay_size": self.replay.size}

    def state_tensors(self) -> dict[str, torch.Tensor]:
        """Both networks, safetensors-ready (the final checkpoint)."""
        return network_tensors({"q": self.q, "target": self.target})

    def restore(self, tensors: Mapping[str, torch.Tensor]) -> None:
        """Both networks back from what `state_tensors` returned."""
        restore_networks({"q": self.q, "target": self.target}, tensors)


def network_tensors(nets: Mapping[str, nn.Module]) -> dict[str, torch.Tensor]:
    """Copies of each net's parameters, named `{its key}.{parameter}`."""
    return {
        f"{prefix}.{k}": v.detach().clone()
        for prefix, net in nets.items()
        for k, v in net.state_dict().items()
    }


def restore_networks(nets: Mapping[str, nn.Module], tensors: Mapping[str, torch.Tensor]) -> None:
    """Load each net from the tensors named `{its key}.{parameter}` (a state_tensors dict)."""
    for prefix, net in nets.items():
        net.load_state_dict({k.removeprefix(f"{prefix}."): v for k, v in tensors.items()
                             if k.startswith(f"{prefix}.")})  # fmt: skip
