"""Builds the SAC agent for a run: replay, its rate limiter, the learner, and how workers act."""

from __future__ import annotations

import math

import numpy as np

from clusterenv.learner.config import TrainConfig
from clusterenv.learner.core.agent import Agent
from clusterenv.learner.replay.rate_limiter import replay_limiter
from clusterenv.learner.replay.uniform import ReplayBuffer
from clusterenv.learner.sac.config import SACConfig
from clusterenv.learner.sac.learning import SACLearner
from clusterenv.pipeline.behaviour import SquashedGaussian, StateDependentNoise
from clusterenv.pipeline.spaces import BoxActions, SpaceSpecs


def build_sac(cfg: TrainConfig[SACConfig], spaces: SpaceSpecs) -> Agent:
    s, chunk, actions = cfg.agent, cfg.collection.chunk_env_steps, spaces.action
    if not isinstance(actions, BoxActions) or spaces.stack:
        raise ValueError("--algo sac needs Box actions and observations that are not frame stacks")
    limiter = replay_limiter(s.samples_per_insert, s.learning_starts, s.batch_size, chunk,
                             chunk * cfg.dispatch.chunks_per_task,
                             cfg.collection.error_buffer_chunks)  # fmt: skip
    obs = spaces.obs
    replay = ReplayBuffer(s.buffer_size, obs.row_shape, np.dtype(obs.dtype), actions.array)
    learner = SACLearner(
        math.prod(obs.row_shape), actions, s, replay, limiter, cfg.seed,
        save_replay=cfg.checkpoint.checkpoint_replay, device=cfg.torch_device(),
    )  # fmt: skip
    # Workers sample the actor and send the actions alone: SAC's update draws its own.
    behaviour = StateDependentNoise() if s.gsde else SquashedGaussian(record=False)
    return Agent(learner, limiter, s.publish_every, lambda steps, actor_envs: behaviour,
                 cfg.weights.max_lag_versions, value_probe=learner.value_model)  # fmt: skip
