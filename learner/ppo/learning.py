"""PPO on chunks: decoupled PPO's clipped ratio, corrected by the workers' behaviour log-probs.

Workers act with their cached policy version, sampling from softmax(logits), and send the
log-prob of each action they took (`logp`) with the transitions (pipeline/chunks/runtime.py). The
ingest thread queues whole chunks here (`insert`); `step()` is one PPO update:

1. take whole chunks until `batch_steps` transitions, dropping (and counting) any chunk whose
   policy version lags the newest published one by more than `max_policy_lag`;
2. values from the learner's *current* critic on obs and next_obs; GAE per actor env inside
   each chunk (`gae`): truncation bootstraps on V(final obs), termination does not; with
   `--advantages vtrace` its trace cut by the truncated ratio π_learner / π_behaviour;
3. `update_epochs` passes of `num_minibatches` Adam steps on `ppo_loss`, whose ratio is
   π_θ(a|s) / π_learner(a|s), the policy at the start of the update, each row weighted by
   π_learner / π_behaviour truncated at 1 with the behaviour log-prob the worker recorded
   (decoupled PPO); `--clip-center behaviour` takes the ratio against π_behaviour (APPO).

Only the policy network is published (the weight-name contract of pipeline/policy.py, what the
workers' numpy_policy reads); the critic stays here. docs/architecture.md (PPO) says why. Policy
and critic are two networks on the same kind of torso (`--torso`), not one shared torso as in
CleanRL's ppo_atari.py: the published policy stays a network of its own.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn

from clusterenv.learner.core.agent import State
from clusterenv.learner.core.networks import (
    CPU,
    build_network,
    hidden_sizes,
    restore_training,
    save_training,
    weighted_layers,
)
from clusterenv.learner.core.policies import Policy
from clusterenv.learner.ppo.config import PPOConfig
from clusterenv.learner.ppo.loss import LossParts, gae, ppo_loss, truncated_ratio
from clusterenv.learner.replay.rate_limiter import RateLimiter
from clusterenv.pipeline.frames import expand


# --- the learner ----------------------------------------------------------------------------------
def _init(net: nn.Module, last_std: float) -> nn.Module:
    """CleanRL's orthogonal init: gain √2 inside (convolutions too, as its ppo_atari.py),
    `last_std` on the output layer, zero biases."""
    layers = weighted_layers(net)
    for i, layer in enumerate(layers):
        nn.init.orthogonal_(layer.weight, np.sqrt(2) if i < len(layers) - 1 else last_std)
        nn.init.constant_(layer.bias, 0.0)
    return net


@dataclass(eq=False)
class QueuedChunk:
    version: int
    arrays: dict[str, np.ndarray]


# What `_prepare` reads of each queued chunk (and the policy's column: `Policy.column`).
_BATCH_COLUMNS = ("obs", "action", "reward", "next_obs", "terminated", "truncated", "env_index",
                  "logp")  # fmt: skip


class PPOLearner:
    """Policy and value networks (ReLU: the activation the workers' numpy forward applies), one
    Adam; chunks queued by the ingest thread, one PPO update per `step()`."""

    def __init__(
        self,
        obs_shape: tuple[int, ...],
        policy: Policy,
        cfg: PPOConfig,
        limiter: RateLimiter,
        lag_of: Callable[[int], int],
        seed: int,
        device: torch.device = CPU,
    ):
        """`policy`: categorical (logits out) or squashed Gaussian (means and log-stds out);
        `device`: where the networks and updates run (a batch is moved there whole)."""
        torch.manual_seed(seed)
        hidden = hidden_sizes(cfg.hidden)
        self.device, self.policy = device, policy
        # What the workers' numpy forward mirrors; here its outputs are the policy's / a value.
        self.actor = _init(build_network(obs_shape, policy.outputs, cfg.torso, hidden), 0.01).to(
            device
        )
        self.critic = _init(build_network(obs_shape, 1, cfg.torso, hidden), 1.0).to(device)
        self.params = [*self.actor.parameters(), *self.critic.parameters()]
        self.optimizer = torch.optim.Adam(self.params, lr=cfg.lr, eps=1e-5)
        self.cfg, self.limiter, self.lag_of = cfg, limiter, lag_of
        self.rng = np.random.default_rng(seed)
        self.updates = 0
        self.last_loss = float("nan")
        self.last: LossParts | None = None
        self.dropped_chunks = self.dropped_rows = 0
        self._queue: deque[QueuedChunk] = deque()
        self._queued_rows = 0
        self._lock = threading.Lock()

    def insert(self, header: dict[str, Any], arrays: dict[str, np.ndarray]) -> int:
        """The ingest thread's sink: queue one chunk for the next update (its observations whole:
        a batch is one update's, so stacked frames are rebuilt here)."""
        arrays, rows = expand(arrays), len(arrays["action"])
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
        column = self.policy.column
        a = {k: np.concatenate([c.arrays[k] for c in batch]) for k in {*_BATCH_COLUMNS, column}}
        rows = len(a["action"])

        def tensor(array: np.ndarray) -> torch.Tensor:
            return torch.as_tensor(array, device=self.device)

        def numpy(t: torch.Tensor) -> np.ndarray:
            return t.double().cpu().numpy()

        # Observations stay as the env made them (uint8 frames: a quarter of float32's bytes)
        # until a network takes them (`_forward`).
        out = {column: tensor(a[column]), "logp": tensor(a["logp"]).float(),
               "obs": tensor(a["obs"])}  # fmt: skip
        with torch.no_grad():  # one forward of each network over the whole batch
            value = numpy(self._forward(self.critic, out["obs"]).squeeze(1))
            next_value = numpy(self._forward(self.critic, tensor(a["next_obs"])).squeeze(1))
            outputs = self._forward(self.actor, out["obs"])
            out["logp_learner"] = self.policy.log_prob(outputs, out[column])
        rho = None
        if self.cfg.advantages == "vtrace":
            rho = numpy(truncated_ratio(out["logp_learner"], out["logp"]))
        reward = a["reward"].astype(np.float64)
        adv, ret = np.empty(rows), np.empty(rows)
        start = 0
        for chunk in batch:  # chunks are never stitched: each is its own set of trajectories
            s = slice(start, start + len(chunk.arrays["action"]))
            adv[s], ret[s] = gae(reward[s], value[s], next_value[s],
                                 a["terminated"][s], a["truncated"][s], a["env_index"][s],
                                 self.cfg.gamma, self.cfg.gae_lambda,
                                 None if rho is None else rho[s])  # fmt: skip
            start = s.stop
        for name, column in (("values", value), ("advantages", adv), ("returns", ret)):
            out[name] = tensor(column).float()
        return out

    @staticmethod
    def _forward(net: nn.Module, obs: torch.Tensor) -> torch.Tensor:
        """The net's outputs for observations of any dtype (the nets take floats)."""
        return net(obs.float())

    def step(self) -> bool:
        """One PPO update if a batch of fresh enough chunks is queued; whether it ran."""
        batch = self._take_batch()
        if batch is None:
            return False
        data = self._prepare(batch)
        rows = len(data["logp"])
        for _ in range(self.cfg.update_epochs):
            for idx in np.array_split(self.rng.permutation(rows), self.cfg.num_minibatches):
                index = torch.as_tensor(idx, device=self.device)
                mb = {k: v[index] for k, v in data.items()}
                parts = ppo_loss(
                    self._forward(self.actor, mb["obs"]),
                    self._forward(self.critic, mb["obs"]).squeeze(1), mb, self.cfg, self.policy,
                )  # fmt: skip
                self.optimizer.zero_grad(set_to_none=True)
                parts.loss.backward()
                nn.utils.clip_grad_norm_(self.params, self.cfg.max_grad_norm)
                self.optimizer.step()
        self.last, self.last_loss = parts, float(parts.loss.detach())
        self.updates += 1
        return True

    def get_weights(self) -> dict[str, np.ndarray]:
        """The policy network only: workers sample from it; the critic never leaves the learner."""
        return self.actor.get_weights()

    def collected(self, env_steps: int) -> None:
        """Nothing follows collection: the learning rate is constant (an asynchronous run has no
        fixed number of updates to anneal over)."""

    def save(self) -> State:
        """Both networks, Adam, the generators and counters. Queued chunks are not kept: a
        resumed run collects afresh (and its limiter starts afresh with the empty queue)."""
        arrays, values = save_training(self, self.networks())
        values["dropped"] = [self.dropped_chunks, self.dropped_rows]
        return arrays, values

    def restore(self, arrays: Mapping[str, np.ndarray], values: Mapping[str, Any]) -> None:
        restore_training(self, self.networks(), arrays, values)
        self.dropped_chunks, self.dropped_rows = values["dropped"]

    def networks(self) -> dict[str, nn.Module]:
        """The networks by the prefix their parameters carry in checkpoints (`actor.` is what
        `clusterenv eval` acts with)."""
        return {"actor": self.actor, "critic": self.critic}

    def metrics(self) -> dict[str, float | int | None]:
        last = self.last
        return {
            "losses/policy_loss": last.policy_loss if last else None,
            "losses/value_loss": last.value_loss if last else None,
            "losses/entropy": last.entropy if last else None,
            "losses/approx_kl": last.approx_kl if last else None,
            "losses/clipfrac": last.clipfrac if last else None,
            "learner/lr": self.optimizer.param_groups[0]["lr"],
            "pipeline/stale_chunks_dropped": self.dropped_chunks,
            "pipeline/stale_rows_dropped": self.dropped_rows,
        }
