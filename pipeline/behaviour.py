"""How workers act on a published network's outputs: one small value per policy kind.

A behaviour value travels in every ChunkRequest (JSON: `{"kind": "epsilon_greedy", "epsilon":
0.05}`, `{"kind": "categorical"}`, `{"kind": "squashed_gaussian"}`, `{"kind": "gsde"}`) and
through the sync interfaces. It knows how to act on the network's outputs (`act`; `acting` for a
whole chunk, where a kind keeps something from step to step) and which divergences between two
versions' outputs apply to it (`DIVERGENCES`, pipeline/sync/divergence.py; the first is the
default of `aps:TOL`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from clusterenv.pipeline.policy import (
    NumpyMLP,
    NumpyPolicy,
    epsilon_greedy,
    sample_categorical,
    sample_squashed_gaussian,
)
from clusterenv.pipeline.sync import divergence
from clusterenv.pipeline.task_args import TaskArgs, TaskArgsError

# One step of a chunk's acting: the network's outputs, the actions, per-row arrays to keep; and
# the function of the envs' observations that gives it (Behaviour.acting).
ActingStep = tuple[np.ndarray, np.ndarray, dict[str, np.ndarray]]
Acting = Callable[[np.ndarray], ActingStep]

# ε is kept to this many decimals: what travels is what the learner holds, and a worker's memo of
# its last divergence is not missed for float noise in a decaying schedule.
EPSILON_DECIMALS = 6


@dataclass(frozen=True)
class Behaviour(TaskArgs):
    """Base of the behaviour values: its kind's name, how it acts, which divergences apply."""

    kind: ClassVar[str]
    # measure name -> function of (learner outputs, worker outputs, this kind's parameters)
    DIVERGENCES: ClassVar[Mapping[str, Callable[..., float]]]

    def act(
        self, outputs: np.ndarray, rng: np.random.Generator
    ) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """Actions for a batch of network outputs, and per-row arrays to keep with them."""
        raise NotImplementedError

    def acting(self, policy: NumpyPolicy, num_envs: int, rng: np.random.Generator) -> Acting:
        """How one chunk of `num_envs` envs acts with `policy`: per step, the network's outputs
        on the envs' observations, and `act` on them (kinds that keep something over a chunk's
        steps give their own)."""

        def act(obs: np.ndarray) -> ActingStep:
            outputs = policy(obs)
            return (outputs, *self.act(outputs, rng))

        return act

    def divergence(self, measure: str, learner: np.ndarray, worker: np.ndarray) -> float:
        """Measure `measure` between the learner's and the worker's outputs on the same states."""
        raise NotImplementedError

    def for_actor(self, slot: int, num_envs: int) -> Behaviour:
        """How one actor (a worker process's vector of `num_envs` envs, in actor slot `slot`)
        acts: the same for every actor, except where a kind gives each actor env its own
        parameters (EpsilonLadder)."""
        return self

    @classmethod
    def probe_width(cls, measure: str, outputs: int) -> int:
        """Columns of a probe row for `measure` on a policy of `outputs` outputs: the learner's
        outputs, and for some measures what the learner adds (SquashedGaussian's `value`)."""
        return outputs

    @classmethod
    def measure(cls, name: str | None, q_values: bool = True) -> str:
        """`name` (None: this kind's default) if it applies to this kind of policy, and to a
        learner without Q-values where `q_values` is False (the value measure reads them); else
        a ValueError naming the measures that do."""
        choices = [m for m in cls.DIVERGENCES if q_values or m != "value"]
        name = name or choices[0]
        if name == "value" and not q_values:
            raise ValueError(
                f"the value measure needs Q-values (DQN, SAC); choose {', '.join(choices)}"
            )
        if name not in choices:
            raise ValueError(
                f"divergence {name!r} does not apply to {cls.kind} policies; "
                f"choose {', '.join(choices)}"
            )
        return name

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, **super().to_json()}

    @classmethod
    def from_json(cls, data: Any, name: str | None = None) -> Behaviour:
        """The value `data` describes, of the kind its `kind` names; TaskArgsError naming the
        field that does not fit (`name`: what messages call the value)."""
        name = name or "behaviour"
        if not isinstance(data, dict):
            return super().from_json(data, name)  # refused: not an object
        kind = data.get("kind")
        sub = BEHAVIOURS.get(kind) if isinstance(kind, str) else None
        if sub is None or not issubclass(sub, cls):
            choices = ", ".join(k for k, b in BEHAVIOURS.items() if issubclass(b, cls))
            raise TaskArgsError(f"{name}.kind must be one of {choices}, got {kind!r}")
        fields = {k: v for k, v in data.items() if k != "kind"}
        return super(Behaviour, sub).from_json(fields, name)


@dataclass(frozen=True)
class EpsilonGreedy(Behaviour):
    """Greedy on Q-values, a uniform action instead with probability `epsilon` (DQN)."""

    epsilon: float
    kind = "epsilon_greedy"
    DIVERGENCES = {"value": divergence.value, "tv": divergence.tv, "kl": divergence.kl}

    def __post_init__(self) -> None:
        object.__setattr__(self, "epsilon", round(self.epsilon, EPSILON_DECIMALS))

    def check(self) -> None:
        if not 0.0 <= self.epsilon <= 1.0:
            raise TaskArgsError(f"epsilon must be in [0, 1], got {self.epsilon}")

    def act(
        self, outputs: np.ndarray, rng: np.random.Generator
    ) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        return epsilon_greedy(outputs, self.epsilon, rng), {}

    def divergence(self, measure: str, learner: np.ndarray, worker: np.ndarray) -> float:
        return self.DIVERGENCES[measure](learner, worker, self.epsilon)


@dataclass(frozen=True)
class EpsilonLadder(Behaviour):
    """Ape-X's exploration (Horgan et al. 2018): actor env i of `size` acts ε-greedily with a fixed
    ε_i = epsilon ** (1 + alpha * i / (size - 1)), from `epsilon` down to epsilon ** (1 + alpha)
    (0.4 and 7: 0.4 to 0.00066), so a few envs explore hard while most act nearly greedily.

    Actor env i's rung is its index over the run (its process's actor slot x envs per actor +
    env) modulo `size`, the actor envs the learner counted when it dispatched the chunk (live
    collecting processes x --envs-per-worker): an env keeps its ε from chunk to chunk while that
    count holds, and a worker that restarts takes over the slot, so the rungs, of the process it
    replaces (pipeline/chunks/slots.py)."""

    epsilon: float
    alpha: float
    size: int
    kind = "epsilon_ladder"
    DIVERGENCES = EpsilonGreedy.DIVERGENCES

    def check(self) -> None:
        if not 0.0 <= self.epsilon <= 1.0:
            raise TaskArgsError(f"epsilon must be in [0, 1], got {self.epsilon}")
        if not self.alpha >= 0.0:
            raise TaskArgsError(f"alpha must be >= 0, got {self.alpha}")
        if self.size < 1:
            raise TaskArgsError(f"size must be >= 1, got {self.size}")

    def epsilons(self, first: int, count: int) -> np.ndarray:
        """ε of the actor envs `first` ... `first + count - 1`."""
        slot = (first + np.arange(count)) % self.size
        return self.epsilon ** (1.0 + self.alpha * slot / max(1, self.size - 1))

    def for_actor(self, slot: int, num_envs: int) -> Behaviour:
        eps = self.epsilons(slot * num_envs, num_envs).round(EPSILON_DECIMALS)
        return EnvEpsilons(tuple(eps.tolist()))

    def act(
        self, outputs: np.ndarray, rng: np.random.Generator
    ) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        # The trap: a ladder has no ε of its own; the runtime acts with for_actor's.
        raise TypeError("an EpsilonLadder acts through for_actor(slot, num_envs)")

    def divergence(self, measure: str, learner: np.ndarray, worker: np.ndarray) -> float:
        return self.DIVERGENCES[measure](learner, worker, self.epsilon)


@dataclass(frozen=True)
class EnvEpsilons(Behaviour):
    """One actor's rung of an EpsilonLadder: ε-greedy with its own ε per env (row). Made on the
    worker by EpsilonLadder.for_actor; never sent."""

    epsilons: tuple[float, ...]
    kind = "env_epsilons"
    DIVERGENCES = EpsilonGreedy.DIVERGENCES

    def act(
        self, outputs: np.ndarray, rng: np.random.Generator
    ) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        return epsilon_greedy(outputs, np.asarray(self.epsilons), rng), {}

    def divergence(self, measure: str, learner: np.ndarray, worker: np.ndarray) -> float:
        # APS's ε-dependent measures over the actor's envs: at their mean ε.
        return self.DIVERGENCES[measure](learner, worker, float(np.mean(self.epsilons)))


@dataclass(frozen=True)
class Categorical(Behaviour):
    """A draw from softmax(logits) (PPO); each row keeps its behaviour log-prob as `logp`, which
    PPO's ratio is taken against."""

    kind = "categorical"
    DIVERGENCES = {"kl": divergence.categorical_kl, "tv": divergence.categorical_tv}

    def act(
        self, outputs: np.ndarray, rng: np.random.Generator
    ) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        actions, logp = sample_categorical(outputs, rng)
        return actions, {"logp": logp}

    def divergence(self, measure: str, learner: np.ndarray, worker: np.ndarray) -> float:
        return self.DIVERGENCES[measure](learner, worker)


@dataclass(frozen=True)
class SquashedGaussian(Behaviour):
    """A draw from tanh(N(mean, std)) on Box actions (PPO, SAC): values in [-1, 1], which the
    action spec scales to the bounds. With `record` each row keeps its behaviour log-prob `logp`
    and its pre-squash sample `pre_squash` (what PPO's learner takes log-probs at; SAC draws its
    own and sends neither)."""

    record: bool = True
    kind = "squashed_gaussian"
    DIVERGENCES = {"kl": divergence.gaussian_kl, "value": divergence.squashed_value}

    def act(
        self, outputs: np.ndarray, rng: np.random.Generator
    ) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        actions, logp, u = sample_squashed_gaussian(outputs, rng)
        return actions, ({"logp": logp, "pre_squash": u} if self.record else {})

    def divergence(self, measure: str, learner: np.ndarray, worker: np.ndarray) -> float:
        return self.DIVERGENCES[measure](learner, worker)

    @classmethod
    def probe_width(cls, measure: str, outputs: int) -> int:
        # `value`: the outputs, then Q_L, its gradient and curvature at a_L (d = outputs / 2 each).
        return 2 * outputs + 1 if measure == "value" else outputs


@dataclass(frozen=True)
class StateDependentNoise(SquashedGaussian):
    """gSDE (Raffin et al. 2022; SB3's `use_sde`) on a gSDE actor (pipeline/policy.py): at each
    state the same squashed Gaussian as its outputs give, but an env's noise is a function of the
    state, u = mean(s) + z(s) θ, with θ ~ N(0, σ²) (F x d) drawn for each env once a chunk (SB3's
    sde_sample_freq -1 with train_freq = --chunk-steps). Over a chunk an env explores along a
    smooth perturbed policy instead of shaking from step to step, which is what an env like
    MountainCarContinuous-v0 needs to be crossed at all. SAC's only: it records nothing (`record`
    False)."""

    record: bool = False
    kind = "gsde"

    def check(self) -> None:
        if self.record:
            raise TaskArgsError("record: gSDE behaviours keep no log-probs (SAC's only)")

    def acting(self, policy: NumpyPolicy, num_envs: int, rng: np.random.Generator) -> Acting:
        if not isinstance(policy, NumpyMLP) or policy.sde_std is None:
            raise ValueError("gsde acts with a gSDE actor (sde.log_std), not this network")
        forward = policy.forward
        theta = policy.sde_std * rng.standard_normal((num_envs, *policy.sde_std.shape))

        def act(obs: np.ndarray) -> ActingStep:
            outputs, z = forward(obs)
            d = outputs.shape[1] // 2
            u = outputs[:, :d] + np.einsum("nf,nfd->nd", z, theta)
            return outputs, np.tanh(u), {}

        return act

    def act(
        self, outputs: np.ndarray, rng: np.random.Generator
    ) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        # The trap: the outputs alone have no features for the noise; a chunk acts through acting.
        raise TypeError("a gSDE behaviour acts through acting(policy, num_envs, rng)")


# The kinds a ChunkRequest may carry (EnvEpsilons is made on the worker, never sent).
BEHAVIOURS: dict[str, type[Behaviour]] = {
    b.kind: b
    for b in (EpsilonGreedy, EpsilonLadder, Categorical, SquashedGaussian, StateDependentNoise)
}
# Every divergence some kind of policy has (a sync spec naming another one is refused as unknown).
MEASURES: frozenset[str] = frozenset(m for b in BEHAVIOURS.values() for m in b.DIVERGENCES)
