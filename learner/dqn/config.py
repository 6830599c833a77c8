"""DQN's settings: the network, the update, replay and its rate, and the workers' ε-greedy
exploration. Defaults: RL-Zoo's CartPole-v1 settings mapped onto this learner's units."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, ClassVar, Literal

import gymnasium as gym
from tyro.conf import arg

from clusterenv.learner.core.networks import Torso, hidden_sizes
from clusterenv.learner.core.settings import require_positive
from clusterenv.pipeline.behaviour import Behaviour, EpsilonGreedy, EpsilonLadder


def linear(start: float, end: float, steps: int, over: int) -> float:
    """From `start` at 0 steps to `end` at `over` steps, and `end` after (ε's and lr's schedules)."""
    return start + min(1.0, steps / max(1, over)) * (end - start)


@dataclass
class DQNConfig:
    """Double DQN from replay; workers act ε-greedily on their cached Q-network."""

    # What the run must know of the agent before it is built (learner/config.py's AgentKind).
    ACTION_SPACES: ClassVar[tuple[type[gym.Space], ...]] = (gym.spaces.Discrete,)
    Q_VALUES: ClassVar[bool] = True
    REPLAY: ClassVar[bool] = True

    lr: float = 2.3e-3
    """Adam learning rate"""
    lr_end: Annotated[float | None, arg(help_behavior_hint="(default: --lr throughout)")] = None
    """learning rate reached at --total-steps env steps, linearly from --lr (RL-Zoo's lin_
    schedules)"""
    batch_size: int = 64
    """minibatch size"""
    gamma: float = 0.99
    """discount"""
    n_step: int = 1
    """n-step returns: each row's target sums up to N rewards of its env and bootstraps from the
    N-th next state (discounted gamma**N), stopping at an episode's end and at its chunk's end;
    computed at ingest (pipeline/n_step.py). 1: one-step targets"""
    hidden: str = "256,256"
    """hidden layer sizes of the Q-network, comma-separated"""
    torso: Torso = "auto"
    """the Q-network's torso: auto picks it from the observation's shape (nature: the Nature DQN's
    convolutions for channel-first (C, 84, 84) frames, scaled by 1/255; minatar: MinAtar's for
    (C, 10, 10) planes; mlp: --hidden on flattened observations, for any other shape); a conv
    torso has its own linear layer (512, 128) and ignores --hidden"""
    dueling: bool = False
    """a dueling head (Wang et al. 2016): Q = V + A - mean(A), a state value and advantages from
    the torso's last layer, on the learner and in the workers' numpy forward"""
    target_update_every: int = 128
    """gradient steps between target-network copies"""
    max_grad_norm: float = 10.0
    """gradient clipping norm"""
    double: bool = True
    """Double DQN targets (the online net picks the next action); --no-double: plain DQN's max"""
    publish_every: int = 128
    """gradient steps between published weight versions"""
    buffer_size: int = 100_000
    """replay capacity in transitions"""
    learning_starts: int = 1_000
    """transitions in replay before the first update"""
    samples_per_insert: float = 32.0
    """sampled transitions per inserted one (128 updates x 64 per 256 env steps = 32)"""
    prioritized: bool = False
    """prioritized replay (Schaul et al. 2016, proportional): rows drawn in proportion to
    (|TD error| + 1e-6) ** --priority-alpha, a new row at the largest priority so far (Rainbow),
    importance weights in the loss (learner/replay/priorities.py)"""
    initial_priority: Literal["max", "worker"] = "max"
    """a new row's priority with --prioritized: max, the largest so far (Rainbow); worker, its
    |n-step TD error| under the worker's own copy of the network, sent with the row (Ape-X;
    pipeline/chunks/priorities.py)"""
    priority_alpha: float = 0.6
    """how much priorities count (0: uniform; the paper's 0.6)"""
    priority_beta: float = 0.4
    """the importance weights' exponent at the start, raised linearly to 1 at --total-steps (the
    paper's 0.4)"""
    eps_start: float = 1.0
    """initial exploration epsilon"""
    eps_end: float = 0.04
    """final exploration epsilon"""
    eps_decay_steps: int = 8_000
    """env steps over which epsilon decays linearly (RL-Zoo's CartPole: 0.16 of its 50k)"""
    exploration: Literal["schedule", "ladder"] = "schedule"
    """schedule: every actor env's ε follows --eps-start to --eps-end over --eps-decay-steps;
    ladder: Ape-X's, each actor env a fixed ε_i = --ladder-epsilon ** (1 + --ladder-alpha * i /
    (N - 1)) over the N actor envs (live collecting processes x --envs-per-worker)"""
    ladder_epsilon: float = 0.4
    """the ladder's highest ε (Ape-X: 0.4)"""
    ladder_alpha: float = 7.0
    """how far down the ladder reaches: its lowest ε is --ladder-epsilon ** (1 + alpha) (Ape-X: 7)"""

    def validate(self) -> None:
        """Raise ValueError naming the first bad setting."""
        require_positive(self, ("batch_size", "buffer_size", "target_update_every",
                                "publish_every", "lr", "samples_per_insert"))  # fmt: skip
        if self.learning_starts < self.batch_size:
            raise ValueError("--learning-starts must be at least --batch-size")
        if not 1 <= self.n_step <= 255:
            raise ValueError(f"--n-step must be 1 to 255, got {self.n_step}")
        if not 0.0 < self.gamma <= 1.0:
            raise ValueError(f"--gamma must be in (0, 1], got {self.gamma}")
        if self.lr_end is not None and not self.lr_end >= 0.0:  # NaN too
            raise ValueError(f"--lr-end must be >= 0, got {self.lr_end}")
        if not (0.0 <= self.eps_end <= self.eps_start <= 1.0):
            raise ValueError("need 0 <= --eps-end <= --eps-start <= 1")
        if not 0.0 <= self.ladder_epsilon <= 1.0 or not self.ladder_alpha >= 0.0:
            raise ValueError("need 0 <= --ladder-epsilon <= 1 and --ladder-alpha >= 0")
        if not 0.0 <= self.priority_alpha <= 1.0 or not 0.0 <= self.priority_beta <= 1.0:
            raise ValueError("need 0 <= --priority-alpha <= 1 and 0 <= --priority-beta <= 1")
        if self.initial_priority == "worker" and not self.prioritized:
            raise ValueError("--initial-priority worker needs --prioritized")
        hidden_sizes(self.hidden)

    def epsilon(self, env_steps: int) -> float:
        return linear(self.eps_start, self.eps_end, env_steps, self.eps_decay_steps)

    @staticmethod
    def policy_kind(box_actions: bool) -> type[Behaviour]:
        """How workers act (pipeline/behaviour.py), for the sync rule's choice of measures."""
        return EpsilonGreedy

    def behaviour(self, env_steps: int, actor_envs: int) -> Behaviour:
        """How workers act on a chunk dispatched at `env_steps`, with `actor_envs` actor envs live."""
        if self.exploration == "ladder":
            return EpsilonLadder(self.ladder_epsilon, self.ladder_alpha, max(1, actor_envs))
        return EpsilonGreedy(self.epsilon(env_steps))

    def beta_at(self, env_steps: int, total_steps: int) -> float:
        """Prioritized replay's importance-weight exponent once `env_steps` are collected."""
        return linear(self.priority_beta, 1.0, env_steps, total_steps)

    def lr_at(self, env_steps: int, total_steps: int) -> float:
        """The learning rate once `env_steps` of the run's `total_steps` are collected."""
        if self.lr_end is None:
            return self.lr
        return linear(self.lr, self.lr_end, env_steps, total_steps)
