"""Double DQN: a Q-network, its target copy, and one gradient step on a replay minibatch.

`DQNLearner.step()` is one update on a minibatch sampled from replay, when the rate limiter
allows it; `update(batch)` is the math alone, with an MLP's backward pass written out by hand
(learner/core/networks.py) and a conv net's through autograd. The learner owns replay and the
rate limiter, and saves them with its networks and Adam's state when the run keeps replay in
checkpoints.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.optim.adam import adam as functional_adam

from clusterenv.learner.core.agent import State
from clusterenv.learner.core.networks import (
    CPU,
    MLP,
    build_network,
    hidden_sizes,
    restore_training,
    save_training,
)
from clusterenv.learner.dqn.config import DQNConfig
from clusterenv.learner.replay.frames import FrameReplay
from clusterenv.learner.replay.priorities import Prioritized
from clusterenv.learner.replay.rate_limiter import RateLimiter
from clusterenv.learner.replay.saved import restore_replay, save_replay
from clusterenv.learner.replay.uniform import ReplayBuffer
from clusterenv.pipeline.n_step import n_step_returns


class DQNLearner:
    """Online and target Q-networks with Adam, trained on minibatches from replay."""

    def __init__(
        self,
        obs_shape: tuple[int, ...],
        num_actions: int,
        cfg: DQNConfig,
        replay: ReplayBuffer | FrameReplay,
        limiter: RateLimiter,
        seed: int,
        total_steps: int = 0,
        save_replay: bool = False,
        device: torch.device = CPU,
    ):
        """`obs_shape`: one observation's (the torso follows it, or --torso); `total_steps`: the
        run's env-step budget (the lr schedule's end); `save_replay`: replay and the rate limiter
        go into checkpoints too (--checkpoint-replay); `device`: where networks and updates run
        (replay stays in host memory; each batch is moved there)."""
        torch.manual_seed(seed)
        hidden = hidden_sizes(cfg.hidden)
        self.device = device
        self.q = build_network(obs_shape, num_actions, cfg.torso, hidden, cfg.dueling).to(device)
        self.target = build_network(obs_shape, num_actions, cfg.torso, hidden, cfg.dueling).to(
            device
        )
        self.target.load_state_dict(self.q.state_dict())
        self.target.requires_grad_(False)
        self._params = params = list(self.q.parameters())
        self.optimizer = torch.optim.Adam(params, lr=cfg.lr, fused=True)
        for p in params:  # Adam's own state, as its first step would create it
            self.optimizer.state[p] = {
                "step": torch.tensor(0.0, device=device),  # fused Adam: beside its parameter
                "exp_avg": torch.zeros_like(p),
                "exp_avg_sq": torch.zeros_like(p),
            }
        self.cfg, self.replay, self.limiter = cfg, replay, limiter
        self.total_steps, self.save_replay = total_steps, save_replay
        self.rng = np.random.default_rng(seed)
        self.updates = 0
        self.last_loss = float("nan")
        self.last_td_errors = torch.zeros(0)
        # Every parameter's .grad is a view into one flat buffer: `backward` writes into it and
        # gradient clipping is then one norm over one tensor.
        self._grads = torch.zeros(sum(p.numel() for p in params), device=device)
        offset = 0
        for p in params:
            p.grad = self._grads[offset : offset + p.numel()].view_as(p)
            offset += p.numel()

    def insert(self, header: dict[str, Any], arrays: Mapping[str, np.ndarray]) -> int:
        """The ingest thread's sink: a chunk's transitions into replay (as n-step returns with
        --n-step); the rows inserted."""
        if self.cfg.n_step > 1:
            arrays = n_step_returns(arrays, self.cfg.n_step, self.cfg.gamma)
        rows = self.replay.insert(arrays)
        self.limiter.on_insert(rows)
        return rows

    def step(self) -> bool:
        """One update on a replay minibatch if the rate limiter allows one; whether it ran."""
        if not self.limiter.can_sample(self.cfg.batch_size):
            return False
        batch = self.replay.sample(self.cfg.batch_size, self.rng)
        self.update(batch)
        if self.cfg.prioritized:  # (a uniform run skips the copy back from the device)
            self.replay.update_priorities(batch, self.last_td_errors.cpu().numpy())
        self.limiter.on_sample(self.cfg.batch_size)
        return True

    @torch.no_grad()
    def update(self, batch: Mapping[str, np.ndarray]) -> float:
        """One Double-DQN gradient step on `batch` (each row's loss scaled by its importance
        `weight`, where prioritized replay gives one); returns the Huber TD loss before the step
        and keeps the TD errors in `last_td_errors`."""
        obs, next_obs, action, reward, terminated, n_steps = (
            torch.from_numpy(batch[name]).to(self.device)
            for name in ("obs", "next_obs", "action", "reward", "terminated", "n_steps")
        )
        # Frames travel to the device as uint8 (a quarter of the bytes) and become floats there.
        obs, next_obs, action = obs.float(), next_obs.float(), action.unsqueeze(1)
        n = len(obs)
        if not isinstance(self.q, MLP):  # a conv net: autograd keeps what its backward needs
            with torch.enable_grad():
                q = self.q(obs)
            if self.cfg.double:
                next_action = self.q(next_obs).argmax(dim=1, keepdim=True)
                next_q = self.target(next_obs).gather(1, next_action).squeeze(1)
            else:
                next_q = self.target(next_obs).max(dim=1).values
        elif self.cfg.double:  # the online net picks the next action, the target net values it
            # One pass of the online net over states and next states (cheaper than two).
            q_both, inputs = self.q.forward_keeping_inputs(torch.cat([obs, next_obs]))
            q, inputs = q_both[:n], [x[:n] for x in inputs]
            next_action = q_both[n:].argmax(dim=1, keepdim=True)
            next_q = self.target(next_obs).gather(1, next_action).squeeze(1)
        else:
            q, inputs = self.q.forward_keeping_inputs(obs)
            next_q = self.target(next_obs).max(dim=1).values
        # An n-step row bootstraps gamma**k later, k its window's length (1 for one-step rows).
        discount = torch.pow(self.cfg.gamma, n_steps.float())
        td_target = reward + discount * (1.0 - terminated) * next_q
        td_error = q.gather(1, action).squeeze(1) - td_target
        # The mean Huber loss's gradient: the TD error clipped to [-1, 1], over the batch, on
        # the action taken and zero on the others; times each row's importance weight.
        grad_td = td_error.clamp(-1, 1).div_(n)
        if "weight" in batch:
            grad_td.mul_(torch.from_numpy(batch["weight"]).to(self.device))
        grad_q = torch.zeros_like(q).scatter_(1, action, grad_td[:, None])
        if isinstance(self.q, MLP):
            self.q.backward(grad_q, inputs)
        else:  # into the .grad views of the one buffer, as MLP.backward writes
            grads = torch.autograd.grad(q, self._params, grad_q)
            for p, g in zip(self._params, grads, strict=True):
                p.grad.copy_(g)
        # clip_grad_norm_'s rule, on the one buffer all the .grad tensors view.
        norm = torch.linalg.vector_norm(self._grads)
        self._grads.mul_((self.cfg.max_grad_norm / (norm + 1e-6)).clamp_(max=1.0))
        self._adam_step()
        self.updates += 1
        if self.updates % self.cfg.target_update_every == 0:
            self.target.load_state_dict(self.q.state_dict())
        self.last_loss = float(nn.functional.huber_loss(td_error, torch.zeros_like(td_error)))
        self.last_td_errors = td_error
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

    def collected(self, env_steps: int) -> None:
        """Set Adam's learning rate for the env steps collected so far (--lr-end's schedule)."""
        self.optimizer.param_groups[0]["lr"] = self.cfg.lr_at(env_steps, self.total_steps)
        if isinstance(self.replay.sampler, Prioritized):
            self.replay.sampler.beta = self.cfg.beta_at(env_steps, self.total_steps)

    def get_weights(self) -> dict[str, np.ndarray]:
        return self.q.get_weights()

    def metrics(self) -> dict[str, float | int | None]:
        return {"losses/td_loss": self.last_loss, "learner/replay_size": self.replay.size,
                "learner/lr": self.optimizer.param_groups[0]["lr"]}  # fmt: skip

    def save(self) -> State:
        """Both networks, Adam, the generators and counters; replay's rows and the limiter's
        counts with `save_replay`."""
        arrays, values = save_training(self, self.networks())
        values["replay"] = None
        if self.save_replay:
            save_replay(self.replay, self.limiter, arrays, values)
        return arrays, values

    def restore(self, arrays: Mapping[str, np.ndarray], values: Mapping[str, Any]) -> None:
        """Take back what `save` returned. Without replay the limiter starts afresh too: no
        update until --learning-starts rows arrived."""
        restore_training(self, self.networks(), arrays, values)
        restore_replay(self.replay, self.limiter, arrays, values)

    def networks(self) -> dict[str, nn.Module]:
        """The networks by the prefix their parameters carry in checkpoints (`q.` is what
        `clusterenv eval` acts with)."""
        return {"q": self.q, "target": self.target}
