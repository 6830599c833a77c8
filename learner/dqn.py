"""Double DQN: a Q-network, its target copy, and one gradient step on a replay minibatch.

`DQNLearner.step()` is one update on a minibatch sampled from replay, when the rate limiter
allows it; `update(batch)` is the math alone. The update's backward pass is written out by hand
(`QNetwork.backward`): for a small MLP on one CPU core, autograd's bookkeeping cost more than the
matrix products (bench/update_cost.py), and tests check the result against autograd's.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.optim.adam import adam as functional_adam

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
        # The same Parameter objects for the net's life: load_state_dict copies into them.
        self._weights_and_biases = [(layer.weight, layer.bias) for layer in self.layers]

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.forward_keeping_inputs(obs)[0]

    def forward_keeping_inputs(self, obs: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """Q-values, and each layer's input (what `backward` needs)."""
        # Plain tensors and F.linear: per-call Module and ModuleList overhead cost more than a
        # 64 x 256 matrix product here (a py-spy profile of a CartPole run).
        x, inputs = obs.reshape(len(obs), -1), []
        for i, (weight, bias) in enumerate(self._weights_and_biases):
            if i > 0:
                x = torch.relu(x)
            inputs.append(x)
            x = nn.functional.linear(x, weight, bias)
        return x, inputs

    def backward(self, grad_q: torch.Tensor, inputs: list[torch.Tensor]) -> None:
        """Write d(loss)/d(parameter) into each parameter's `.grad`, given d(loss)/d(Q-values)
        and the layer inputs from `forward_keeping_inputs`. The `.grad` tensors must exist."""
        g = grad_q
        for i in reversed(range(len(inputs))):
            weight, bias = self._weights_and_biases[i]
            torch.mm(g.t(), inputs[i], out=weight.grad)
            torch.sum(g, 0, out=bias.grad)
            if i > 0:
                # A ReLU's output is 0 or positive, so its sign is the ReLU's derivative
                # (and cheaper here than a boolean mask).
                g = g.mm(weight).mul_(inputs[i].sign())

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
        self._params = params = list(self.q.parameters())
        self.optimizer = torch.optim.Adam(params, lr=cfg.lr, fused=True)
        for p in params:  # Adam's own state, as its first step would create it
            self.optimizer.state[p] = {
                "step": torch.tensor(0.0),
                "exp_avg": torch.zeros_like(p),
                "exp_avg_sq": torch.zeros_like(p),
            }
        self.cfg, self.replay, self.limiter = cfg, replay, limiter
        self.rng = np.random.default_rng(seed)
        self.updates = 0
        self.last_loss = float("nan")
        # Every parameter's .grad is a view into one flat buffer: `backward` writes into it and
        # gradient clipping is then one norm over one tensor.
        self._grads = torch.zeros(sum(p.numel() for p in params))
        offset = 0
        for p in params:
            p.grad = self._grads[offset : offset + p.numel()].view_as(p)
            offset += p.numel()

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
        self.update(batch)
        self.limiter.on_sample(self.cfg.batch_size)
        return True

    @torch.no_grad()
    def update(self, batch: Mapping[str, np.ndarray]) -> float:
        """One Double-DQN gradient step on `batch`; returns the Huber TD loss before the step."""
        obs = torch.from_numpy(batch["obs"]).float()
        next_obs = torch.from_numpy(batch["next_obs"]).float()
        action = torch.from_numpy(batch["action"]).unsqueeze(1)
        reward = torch.from_numpy(batch["reward"])
        terminated = torch.from_numpy(batch["terminated"])
        n = len(obs)
        if self.cfg.double:  # the online net picks the next action, the target net values it
            # One pass of the online net over states and next states (cheaper than two).
            q_both, inputs = self.q.forward_keeping_inputs(torch.cat([obs, next_obs]))
            q, inputs = q_both[:n], [x[:n] for x in inputs]
            next_action = q_both[n:].argmax(dim=1, keepdim=True)
            next_q = self.target(next_obs).gather(1, next_action).squeeze(1)
        else:
            q, inputs = self.q.forward_keeping_inputs(obs)
            next_q = self.target(next_obs).max(dim=1).values
        td_target = reward + self.cfg.gamma * (1.0 - terminated) * next_q
        td_error = q.gather(1, action).squeeze(1) - td_target
        # The mean Huber loss's gradient: the TD error clipped to [-1, 1], over the batch, on
        # the action taken and zero on the others.
        grad_q = torch.zeros_like(q).scatter_(1, action, td_error.clamp(-1, 1).div_(n)[:, None])
        self.q.backward(grad_q, inputs)
        # clip_grad_norm_'s rule, on the one buffer all the .grad tensors view.
        norm = torch.linalg.vector_norm(self._grads)
        self._grads.mul_((self.cfg.max_grad_norm / (norm + 1e-6)).clamp_(max=1.0))
        self._adam_step()
        self.updates += 1
        if self.updates % self.cfg.target_update_every == 0:
            self.target.load_state_dict(self.q.state_dict())
        self.last_loss = float(nn.functional.huber_loss(td_error, torch.zeros_like(td_error)))
        return self.last_loss

    def _adam_step(self) -> None:
        """`self.optimizer.step()` through torch's functional Adam: the same fused arithmetic on
        the optimizer's own state (checkpoints and the lr schedule see no difference), without
        Optimizer.step's per-call wrappers (a fifth of a CartPole update in a py-spy profile)."""
        group, params = self.optimizer.param_groups[0], self._params
        states = [self.optimizer.state[p] for p in params]  # new tensors after a resume
        functional_adam(
            params, [p.grad for p in params],
            [s["exp_avg"] for s in states], [s["exp_avg_sq"] for s in states], [],
            [s["step"] for s in states], fused=True, amsgrad=False,
            beta1=group["betas"][0], beta2=group["betas"][1], lr=group["lr"],
            weight_decay=group["weight_decay"], eps=group["eps"], maximize=False,
        )  # fmt: skip

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
