"""One learner interface for DQN and PPO (Acme's Learner), and the run's algorithm-specific parts.

The trainer, dispatch, stream, weights, sync, evaluation and accounting see only `Algorithm`: the
learner behind the `Learner` interface, the extra arrays its chunks carry, how often a version is
published, how the workers are asked to act (their behaviour: ε-greedy with a decaying ε, or
categorical) and the learning rate as collection goes on.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import gymnasium as gym
import numpy as np
import torch

from clusterenv.learner.config import TrainConfig
from clusterenv.learner.dqn import DQNLearner
from clusterenv.learner.ppo import PPOLearner
from clusterenv.learner.rate_limiter import RateLimiter
from clusterenv.learner.replay import ReplayBuffer
from clusterenv.pipeline.behaviour import Behaviour, Categorical, EpsilonGreedy
from clusterenv.pipeline.codec import ArraySpec
from clusterenv.pipeline.sync.source import reference_pool_rows


class Learner(Protocol):
    """What the trainer asks of an algorithm's learner."""

    updates: int  # learner updates so far: gradient steps (DQN) or PPO updates
    last_loss: float  # the last update's loss (NaN before the first)
    optimizer: torch.optim.Optimizer  # its state goes into checkpoints (learner/state.py)
    rng: np.random.Generator  # the learner's own sampling (minibatches), checkpointed too
    limiter: RateLimiter  # dispatch asks it whether collection may run further ahead
    replay: ReplayBuffer  # recently inserted rows: where probes' reference states come from

    def insert(self, header: dict[str, Any], arrays: dict[str, np.ndarray]) -> int:
        """Store one accepted chunk (from the ingest thread); the rows stored."""
        ...

    def step(self) -> bool:
        """One update if the data allows; whether it ran."""
        ...

    def get_weights(self) -> dict[str, np.ndarray]:
        """The network workers act with (`layers.{i}.*`, what pipeline.policy.NumpyMLP reads)."""
        ...

    def state_tensors(self) -> dict[str, torch.Tensor]:
        """Every network, for checkpoints."""
        ...

    def restore(self, tensors: dict[str, torch.Tensor]) -> None:
        """Every network back from what `state_tensors` returned."""
        ...

    def metrics(self) -> dict[str, float | int | None]:
        """Namespaced figures for the metrics rows (losses/…, learner/…, pipeline/…)."""
        ...


@dataclass
class Algorithm:
    learner: Learner
    publish_every: int  # learner updates between published versions
    # How workers act on chunks dispatched at an env-step count (pipeline/behaviour.py), sent in
    # every ChunkRequest.
    behaviour: Callable[[int], Behaviour]
    max_lag_versions: int  # the APS version guard the workers are sent (0: none)
    lr: Callable[[int], float]  # the learner's learning rate at an env-step count
    extra_specs: dict[str, ArraySpec] = field(default_factory=dict)  # arrays beyond transitions


def build_algorithm(
    cfg: TrainConfig,
    obs_space: gym.spaces.Box,
    num_actions: int,
    lag_versions: Callable[[int], int],
) -> Algorithm:
    """The learner of `cfg.algo` with its limiter; `lag_versions(v)`: how many versions the policy
    version v is behind the newest published one (PPO drops chunks past --max-policy-lag)."""
    chunk = cfg.collection.chunk_env_steps
    # Dispatch sends whole tasks: the limiter's slack must admit one, or dispatch (waiting for
    # training to catch up) and training (waiting for data) can each wait for the other for good.
    task = chunk * cfg.dispatch.chunks_per_task
    if cfg.algo == "ppo":
        p = cfg.ppo
        # On-policy: collection may run ahead of training by one batch and a few chunks (at least
        # a task), no more.
        limiter = RateLimiter(
            1.0, 0, p.batch_steps + max(chunk * cfg.replay.error_buffer_chunks, task)
        )
        learner = PPOLearner(
            obs_space.shape, obs_space.dtype, num_actions, p, limiter, lag_versions,
            recent_rows=reference_pool_rows(cfg.weights.reference_size), seed=cfg.seed,
        )  # fmt: skip
        # An APS worker whose policy the learner would drop must fetch, or the run stalls: the
        # dropped chunks stop learning, so the divergence that would trigger the fetch never grows.
        # Half the max lag leaves room for the versions published while a chunk is on its way.
        guard = cfg.weights.max_lag_versions
        if cfg.weights.sync.startswith("aps:"):
            half = max(1, p.max_policy_lag // 2)
            guard = min(guard, half) if guard else half
        # Every PPO update is a version: lag in versions is lag in policy updates.
        return Algorithm(learner, 1, lambda steps: Categorical(), guard,
                         lambda steps: p.ppo_lr, {"logp": ArraySpec("<f4", ())})  # fmt: skip
    r, spi = cfg.replay, cfg.replay.samples_per_insert
    replay = ReplayBuffer(r.buffer_size, obs_space.shape, obs_space.dtype)
    limiter = RateLimiter(
        spi,
        min_size=r.learning_starts,
        # Collection may run ahead of training by a few chunks, so neither side idles on the other;
        # sampling stops within a batch of the band's low edge, from where a task must still fit.
        error_buffer=max(spi * chunk * r.error_buffer_chunks, spi * task + cfg.dqn.batch_size),
    )
    dqn = DQNLearner(int(np.prod(obs_space.shape)), num_actions, cfg.dqn, replay, limiter, cfg.seed)
    w = cfg.weights
    return Algorithm(
        dqn, w.publish_every, lambda steps: EpsilonGreedy(cfg.collection.epsilon(steps)),
        w.max_lag_versions,
        lambda steps: cfg.dqn.lr_at(steps, cfg.total_steps),
    )  # fmt: skip
