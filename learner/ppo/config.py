"""PPO's settings: CleanRL's ppo.py defaults, the decoupled loss's and V-trace's switches, and
how stale a chunk may be."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Literal

import gymnasium as gym

from clusterenv.learner.core.networks import Torso, hidden_sizes
from clusterenv.learner.core.settings import require_non_negative, require_positive
from clusterenv.pipeline.behaviour import Behaviour, Categorical, SquashedGaussian


@dataclass
class PPOConfig:
    """PPO on chunks; workers sample their cached policy and send its log-probs. CleanRL's
    ppo.py defaults."""

    # What the run must know of the agent before it is built (learner/config.py's AgentKind):
    # PPO's critic values states, not actions, so the learner has no Q-values; it learns from
    # fresh chunks, no replay.
    ACTION_SPACES: ClassVar[tuple[type[gym.Space], ...]] = (gym.spaces.Discrete, gym.spaces.Box)
    Q_VALUES: ClassVar[bool] = False
    REPLAY: ClassVar[bool] = False

    @staticmethod
    def policy_kind(box_actions: bool) -> type[Behaviour]:
        """Sampled logits, or a squashed Gaussian on Box actions (pipeline/behaviour.py)."""
        return SquashedGaussian if box_actions else Categorical

    lr: float = 2.5e-4
    """Adam learning rate (constant: an asynchronous run has no fixed number of updates to anneal over)"""
    gamma: float = 0.99
    """discount"""
    gae_lambda: float = 0.95
    """lambda of generalized advantage estimation"""
    clip_coef: float = 0.2
    """PPO's clip range of the ratio pi/pi_center (--clip-center)"""
    clip_center: Literal["learner", "behaviour"] = "learner"
    """learner: clip pi/pi_learner, the learner's policy at the start of the update, and weight each
    row by pi_learner/pi_behaviour truncated at 1 (decoupled PPO, Hilton et al. 2022: the trust
    region stays around the learner however stale the chunk); behaviour: clip pi/pi_behaviour
    (APPO). The same loss when the chunks are not stale"""
    advantages: Literal["gae", "vtrace"] = "gae"
    """gae: GAE(lambda) on the current critic, uncorrected for lag; vtrace: each later step's part
    of the lambda-trace cut by min(1, pi_learner/pi_behaviour) of its action, and value targets
    weighted by it (V-trace, IMPALA, with both truncations at 1). The same when chunks are not stale"""
    ent_coef: float = 0.01
    """entropy bonus coefficient"""
    vf_coef: float = 0.5
    """value loss coefficient"""
    clip_vloss: bool = True
    """clip the value loss around the values at the start of the update, as CleanRL"""
    norm_adv: bool = True
    """normalize advantages per minibatch"""
    max_grad_norm: float = 0.5
    """gradient clipping norm"""
    update_epochs: int = 4
    """passes over each batch"""
    num_minibatches: int = 4
    """minibatches per pass"""
    batch_steps: int = 512
    """transitions (whole chunks) per PPO update; CleanRL: 4 envs x 128 steps"""
    max_policy_lag: int = 8
    """chunks acted by a policy version more than this many versions behind the newest (one version
    per PPO update) are dropped before training, and counted"""
    hidden: str = "64,64"
    """hidden layer sizes of the policy and of the value network, comma-separated"""
    torso: Torso = "auto"
    """the torso of the policy and of the value network (two networks, each its own torso of
    this kind): auto picks it from the observation's shape (nature: the Nature DQN's
    convolutions for channel-first (C, 84, 84) frames, scaled by 1/255; minatar: MinAtar's for
    (C, 10, 10) planes; mlp: --hidden on flattened observations, for any other shape); a conv
    torso has its own linear layer (512, 128) and ignores --hidden"""

    def validate(self) -> None:
        """Raise ValueError naming the first bad setting."""
        require_positive(
            self, ("lr", "update_epochs", "num_minibatches", "batch_steps", "max_grad_norm")
        )
        require_non_negative(self, ("clip_coef", "ent_coef", "vf_coef", "max_policy_lag"))
        if not 0.0 < self.gamma <= 1.0 or not 0.0 <= self.gae_lambda <= 1.0:
            raise ValueError("need 0 < --gamma <= 1 and 0 <= --gae-lambda <= 1")
        if self.batch_steps < self.num_minibatches:
            raise ValueError("--batch-steps must be at least --num-minibatches")
        hidden_sizes(self.hidden)
