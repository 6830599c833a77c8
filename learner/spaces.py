"""What the learner needs to know of an env before the workers build it: spaces and threshold."""

from __future__ import annotations

from typing import Any

import gymnasium as gym

from clusterenv.learner.config import AGENT_CONFIGS
from clusterenv.pipeline.envs import make_env
from clusterenv.pipeline.spaces import SpaceSpecs, stack_depth


def env_spaces(
    env_id: str, env_kwargs: dict[str, Any], algo: str = "dqn"
) -> tuple[SpaceSpecs, float | None]:
    """The env's observation and action specs as chunks carry them (a stack of frames noted as
    such) and its reward threshold; ValueError if `algo` cannot train on them (every agent takes
    Box observations; the agent config's ACTION_SPACES says which actions; Discrete ones
    numbered from 0, Box ones bounded)."""
    try:
        env = make_env(env_id, env_kwargs, training=True)
    except gym.error.Error as exc:
        raise ValueError(f"--env {env_id!r}: {exc}") from None
    except TypeError as exc:
        raise ValueError(f"--env-kwargs for {env_id!r}: {exc}") from None
    try:
        obs_space, act_space = env.observation_space, env.action_space
        takes = AGENT_CONFIGS[algo].ACTION_SPACES
        if not isinstance(act_space, takes):
            kinds = " or ".join(kind.__name__ for kind in takes)
            other = [a for a, c in AGENT_CONFIGS.items() if isinstance(act_space, c.ACTION_SPACES)]
            also = f" (--algo {' or '.join(other)} trains those)" if other else ""
            raise ValueError(
                f"--env {env_id!r}: --algo {algo} needs a {kinds} action space, not "
                f"{act_space}{also}"
            )
        if isinstance(act_space, gym.spaces.Discrete) and int(act_space.start) != 0:
            # The agents index their outputs by the action itself (Q-values, logits).
            raise ValueError(f"--env {env_id!r}: the agents need Discrete actions numbered from "
                             f"0, not {act_space}")  # fmt: skip
        if not isinstance(obs_space, gym.spaces.Box):
            raise ValueError(f"--env {env_id!r}: needs a Box observation space, not {obs_space}")
        try:
            spaces = SpaceSpecs.of(obs_space, act_space, stack_depth(env))
        except ValueError as exc:
            raise ValueError(f"--env {env_id!r}: {exc}") from None
        return spaces, env.spec.reward_threshold if env.spec else None
    finally:
        env.close()
