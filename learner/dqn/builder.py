"""Builds the DQN agent for a run: replay, its rate limiter, the learner, and how workers act."""

from __future__ import annotations

import numpy as np

from clusterenv.learner.config import TrainConfig
from clusterenv.learner.core.agent import Agent
from clusterenv.learner.dqn.config import DQNConfig
from clusterenv.learner.dqn.learning import DQNLearner
from clusterenv.learner.replay.frames import FrameReplay
from clusterenv.learner.replay.priorities import Prioritized, Sampler, Uniform
from clusterenv.learner.replay.rate_limiter import replay_limiter
from clusterenv.learner.replay.uniform import ReplayBuffer
from clusterenv.pipeline.chunks.priorities import PRIORITY
from clusterenv.pipeline.codec import ArraySpec
from clusterenv.pipeline.spaces import SpaceSpecs


def replay_for(spaces: SpaceSpecs, d: DQNConfig) -> FrameReplay | ReplayBuffer:
    """DQN's replay for these spaces: stacked frames stored once each (learner/replay/frames.py),
    other observations whole; sampled uniformly or by priority (--prioritized)."""
    obs, action, capacity = spaces.obs, spaces.action.array, d.buffer_size
    sampler: Sampler = (
        Prioritized(capacity, d.priority_alpha, d.priority_beta) if d.prioritized else Uniform()
    )
    if spaces.stack:
        return FrameReplay(capacity, spaces.stack, spaces.frame, action, sampler)
    return ReplayBuffer(capacity, obs.row_shape, np.dtype(obs.dtype), action, sampler)


def build_dqn(cfg: TrainConfig[DQNConfig], spaces: SpaceSpecs) -> Agent:
    d, chunk = cfg.agent, cfg.collection.chunk_env_steps
    limiter = replay_limiter(d.samples_per_insert, d.learning_starts, d.batch_size, chunk,
                             chunk * cfg.dispatch.chunks_per_task,
                             cfg.collection.error_buffer_chunks)  # fmt: skip
    obs, replay = spaces.obs, replay_for(spaces, d)
    learner = DQNLearner(
        obs.row_shape, spaces.action.n, d, replay, limiter, cfg.seed,
        total_steps=cfg.total_steps, save_replay=cfg.checkpoint.checkpoint_replay,
        device=cfg.torch_device(),
    )  # fmt: skip
    agent = Agent(learner, limiter, d.publish_every, d.behaviour, cfg.weights.max_lag_versions)
    if d.initial_priority == "worker":  # each row's |TD error| from its worker (Ape-X)
        agent.extra_specs = {PRIORITY: ArraySpec("<f4", ())}
        agent.task_fields = {"priority_n_step": d.n_step, "priority_gamma": d.gamma}
    return agent
