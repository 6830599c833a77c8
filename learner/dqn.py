"""Double DQN: a Q-network, its target copy, and one gradient step on a replay minibatch."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import torch
from torch import nn


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
        """Numpy copies named `layers.{i}.weight|bias`, the names pipeline.policy.NumpyMLP reads."""
        return {k: v.detach().cpu().numpy().copy() for k, v in self.state_dict().items()}


class DQNLearner:
    """Online and target Q-networks with Adam; `step(batch)` is one Double-DQN update."""

    def __init__(
        self,
        obs_dim: int,
        num_actions: int,
        hidden: list[int],
        lr: float,
        gamma: float,
        target_update_every: int,
        max_grad_norm: float,
        seed: int,
    ):
        torch.manual_seed(seed)
        self.q = QNetwork(obs_dim, num_actions, hidden)
        self.target = QNetwork(obs_dim, num_actions, hidden)
        self.target.load_state_dict(self.q.state_dict())
        self.target.requires_grad_(False)
        self.optimizer = torch.optim.Adam(self.q.parameters(), lr=lr, fused=True)
        self.gamma = gamma
        self.target_update_every = target_update_every
        self.max_grad_norm = max_grad_norm
        self.updates = 0
        self._params = list(self.q.parameters())

    def step(self, batch: Mapping[str, np.ndarray]) -> float:
        obs = torch.from_numpy(batch["obs"]).float()
        next_obs = torch.from_numpy(batch["next_obs"]).float()
        action = torch.from_numpy(batch["action"])
        reward = torch.from_numpy(batch["reward"])
        terminated = torch.from_numpy(batch["terminated"])
        n = len(obs)
        # One forward over obs and next_obs: the online net both scores the taken action and,
        # detached, picks the next action (Double DQN); the target net evaluates that pick.
        q_all = self.q(torch.cat([obs, next_obs]))
        with torch.no_grad():
            next_action = q_all[n:].argmax(dim=1, keepdim=True)
            next_q = self.target(next_obs).gather(1, next_action).squeeze(1)
            td_target = reward + self.gamma * (1.0 - terminated) * next_q
        q_taken = q_all[:n].gather(1, action.unsqueeze(1)).squeeze(1)
        loss = nn.functional.smooth_l1_loss(q_taken, td_target)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        nn.utils.clip_grad_norm_(self._params, self.max_grad_norm, foreach=True)
        self.optimizer.step()
        self.updates += 1
        if self.updates % self.target_update_every == 0:
            self.target.load_state_dict(self.q.state_dict())
        return float(loss.detach())

    def get_weights(self) -> dict[str, np.ndarray]:
        return self.q.get_weights()

    def state_tensors(self) -> dict[str, torch.Tensor]:
        """Everything a checkpoint needs to resume: both networks (safetensors-ready)."""
        out = {f"q.{k}": v.detach().clone() for k, v in self.q.state_dict().items()}
        out.update({f"target.{k}": v.detach().clone() for k, v in self.target.state_dict().items()})
        return out

    def load_state_tensors(self, tensors: Mapping[str, torch.Tensor]) -> None:
        self.q.load_state_dict({k[2:]: v for k, v in tensors.items() if k.startswith("q.")})
        self.target.load_state_dict(
            {k[7:]: v for k, v in tensors.items() if k.startswith("target.")}
        )
