"""Builds the PPO agent for a run: the learner, its on-policy rate limit, and how workers act."""

from __future__ import annotations

from collections.abc import Callable

from clusterenv.learner.config import TrainConfig
from clusterenv.learner.core.agent import Agent
from clusterenv.learner.core.policies import CategoricalPolicy, Policy, SquashedGaussianPolicy
from clusterenv.learner.ppo.config import PPOConfig
from clusterenv.learner.ppo.learning import PPOLearner
from clusterenv.learner.replay.rate_limiter import RateLimiter
from clusterenv.pipeline.codec import ArraySpec
from clusterenv.pipeline.spaces import BoxActions, SpaceSpecs


def build_ppo(
    cfg: TrainConfig[PPOConfig], spaces: SpaceSpecs, lag_versions: Callable[[int], int]
) -> Agent:
    """`lag_versions(v)`: how many versions the policy version v is behind the newest published
    one (chunks past --max-policy-lag are dropped)."""
    p, chunk = cfg.agent, cfg.collection.chunk_env_steps
    task = chunk * cfg.dispatch.chunks_per_task
    # On-policy: collection may run ahead of training by one batch and a few chunks (at least a
    # task, or dispatch and training could each wait for the other), no more.
    limiter = RateLimiter(
        1.0, 0, p.batch_steps + max(chunk * cfg.collection.error_buffer_chunks, task)
    )
    # Discrete actions: a categorical policy, each row's behaviour log-prob sent with it; Box
    # actions: a squashed Gaussian, its pre-squash sample sent too (learner/ppo/loss.py).
    extra = {"logp": ArraySpec("<f4", ())}
    action = spaces.action
    behaviour = p.policy_kind(isinstance(action, BoxActions))()
    policy: Policy
    if isinstance(action, BoxActions):
        policy = SquashedGaussianPolicy(action.dim)
        extra["pre_squash"] = ArraySpec("<f4", (action.dim,))
    else:
        policy = CategoricalPolicy(action.n)
    learner = PPOLearner(spaces.obs.row_shape, policy, p, limiter, lag_versions,
                         seed=cfg.seed, device=cfg.torch_device())  # fmt: skip
    # An APS worker whose policy the learner would drop must fetch, or the run stalls: the
    # dropped chunks stop learning, so the divergence that would trigger the fetch never grows.
    # Half the max lag leaves room for the versions published while a chunk is on its way.
    guard = cfg.weights.max_lag_versions
    if cfg.weights.sync.startswith("aps:"):
        half = max(1, p.max_policy_lag // 2)
        guard = min(guard, half) if guard else half
    # Every PPO update is a version: lag in versions is lag in policy updates.
    return Agent(learner, limiter, 1, lambda steps, actor_envs: behaviour, guard, extra)
