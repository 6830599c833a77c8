"""SAC's settings: Stable-Baselines3's SAC defaults (RL-Zoo's per-env values are presets)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, ClassVar

import gymnasium as gym
from tyro.conf import arg

from clusterenv.learner.core.networks import hidden_sizes
from clusterenv.learner.core.settings import require_positive
from clusterenv.pipeline.behaviour import Behaviour, SquashedGaussian


@dataclass
class SACConfig:
    """Soft actor-critic from replay (Haarnoja et al. 2018, with automatic entropy tuning); workers
    sample their cached actor, a tanh-squashed Gaussian, and evaluation acts with its mean."""

    # What the run must know of the agent before it is built (learner/config.py's AgentKind).
    ACTION_SPACES: ClassVar[tuple[type[gym.Space], ...]] = (gym.spaces.Box,)
    Q_VALUES: ClassVar[bool] = True
    REPLAY: ClassVar[bool] = True

    @staticmethod
    def policy_kind(box_actions: bool) -> type[Behaviour]:
        """A squashed Gaussian (pipeline/behaviour.py; with --gsde its StateDependentNoise, whose
        divergences are the same)."""
        return SquashedGaussian

    lr: float = 3e-4
    """Adam learning rate of the actor, the critics and the entropy coefficient"""
    batch_size: int = 256
    """minibatch size"""
    gamma: float = 0.99
    """discount"""
    tau: float = 0.005
    """target critics move this far towards the critics after every update (Polyak averaging)"""
    hidden: str = "256,256"
    """hidden layer sizes of the actor and of each critic, comma-separated"""
    init_alpha: float = 1.0
    """the entropy coefficient at the start (tuned from there towards --target-entropy)"""
    learn_alpha: bool = True
    """tune the entropy coefficient; with --no-learn-alpha it stays at --init-alpha (SB3's
    ent_coef given as a number)"""
    target_entropy: Annotated[
        float | None, arg(help_behavior_hint="(default: minus the action's dimensions)")
    ] = None
    """the policy entropy the coefficient is tuned for (the paper's and SB3's default)"""
    gsde: bool = False
    """generalized state-dependent exploration (Raffin et al. 2022, SB3's use_sde): each env's
    noise is a function of the state, held for a chunk of --chunk-steps (pipeline/behaviour.py)"""
    log_std_init: float = -3.0
    """with --gsde: the log σ every weight of the noise starts at (SB3's default)"""
    publish_every: int = 32
    """gradient steps between published actor versions"""
    buffer_size: int = 1_000_000
    """replay capacity in transitions"""
    learning_starts: int = 100
    """transitions in replay before the first update"""
    samples_per_insert: float = 256.0
    """sampled transitions per inserted one (one update of 256 per env step, SB3's train_freq 1)"""

    def validate(self) -> None:
        """Raise ValueError naming the first bad setting."""
        require_positive(self, ("lr", "batch_size", "buffer_size", "publish_every",
                                "samples_per_insert", "init_alpha"))  # fmt: skip
        if not 0.0 < self.gamma <= 1.0:
            raise ValueError(f"--gamma must be in (0, 1], got {self.gamma}")
        if not 0.0 < self.tau <= 1.0:
            raise ValueError(f"--tau must be in (0, 1], got {self.tau}")
        if self.learning_starts < 1:
            raise ValueError(f"--learning-starts must be >= 1, got {self.learning_starts}")
        hidden_sizes(self.hidden)
