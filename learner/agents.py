"""The agents a run can train, by the name `--algo` gives: the one module that knows them all."""

from __future__ import annotations

from collections.abc import Callable

from clusterenv.learner.config import TrainConfig
from clusterenv.learner.core.agent import Agent
from clusterenv.learner.dqn.builder import build_dqn
from clusterenv.learner.ppo.builder import build_ppo
from clusterenv.learner.sac.builder import build_sac
from clusterenv.pipeline.spaces import SpaceSpecs


def build_agent(cfg: TrainConfig, spaces: SpaceSpecs, lag_versions: Callable[[int], int]) -> Agent:
    """The agent `cfg.algo` names, built for the env's `spaces` (as chunks carry them);
    `lag_versions(v)`: how many versions the policy version v is behind the newest published one."""
    if cfg.algo == "ppo":
        return build_ppo(cfg, spaces, lag_versions)
    if cfg.algo == "sac":
        return build_sac(cfg, spaces)
    return build_dqn(cfg, spaces)
