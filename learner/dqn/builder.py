"""Builds the DQN agent for a run: replay, its rate limiter, the learner, and how workers act."""

from __future__ import annotations

import numpy as np

from clusterenv.learner.config import TrainConfig
from clusterenv.learner.core.agent import Agent
from clusterenv.learner.dqn.config import DQNConfig
from clusterenv.learner.dqn.learning import DQNLearner
from clusterenv.learner.replay.frames import FrameReplay
from clusterenv.learner.replay.rate_limiter import RateLimiter
from clusterenv.learner.replay.uniform import ReplayBuffer
from clusterenv.pipeline.spaces import SpaceSpecs


def replay_for(spaces: SpaceSpecs, capacity: int) -> FrameReplay | ReplayBuffer:
    """DQN's replay for these spaces: stacked frames stored once each (learner/replay/frames.py),
    other observations whole."""
    obs, action = spaces.obs, spaces.action.array
    if spaces.stack:
        return FrameReplay(capacity, spaces.stack, spaces.frame, action)
    return ReplayBuffer(capacity, obs.row_shape, np.dtype(obs.dtype), action)


def build_dqn(cfg: TrainConfig[DQNConfig], spaces: SpaceSpecs) -> Agent:
    d, chunk = cfg.agent, cfg.collection.chunk_env_steps
    # Dispatch sends whole tasks: the limiter's slack must admit one, or dispatch (waiting for
    # training to catch up) and training (waiting for data) can each wait for the other for good.
    task = chunk * cfg.dispatch.chunks_per_task
    spi = d.samples_per_insert
    limiter = RateLimiter(
        spi,
        min_size=d.learning_starts,
        # Collection may run ahead of training by a few chunks, so neither side idles on the other;
        # sampling stops within a batch of the band's low edge, from where a task must still fit.
        error_buffer=max(spi * chunk * cfg.collection.error_buffer_chunks,
                         spi * task + d.batch_size),
    )  # fmt: skip
    obs, replay = spaces.obs, replay_for(spaces, d.buffer_size)
    learner = DQNLearner(
        obs.row_shape, spaces.action.n, d, replay, limiter, cfg.seed,
        total_steps=cfg.total_steps, save_replay=cfg.checkpoint.checkpoint_replay,
        device=cfg.torch_device(),
    )  # fmt: skip
    return Agent(learner, limiter, d.publish_every, d.behaviour, cfg.weights.max_lag_versions)
