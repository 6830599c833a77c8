"""How workers act on a published network's outputs: one small value per policy kind.

A behaviour value travels in every ChunkRequest (JSON: `{"kind": "epsilon_greedy", "epsilon":
0.05}`, `{"kind": "categorical"}`) and through the sync interfaces. It knows how to act on the
network's outputs (`act`) and which divergences between two versions' outputs apply to it
(`DIVERGENCES`, pipeline/sync/divergence.py; the first is the default of `aps:TOL`). A Gaussian
policy (continuous actions) is one more subclass, registered in BEHAVIOURS.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from clusterenv.pipeline.policy import epsilon_greedy, sample_categorical
from clusterenv.pipeline.sync import divergence
from clusterenv.pipeline.task_args import TaskArgs, TaskArgsError

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

    def divergence(self, measure: str, learner: np.ndarray, worker: np.ndarray) -> float:
        """Measure `measure` between the learner's and the worker's outputs on the same states."""
        raise NotImplementedError

    @classmethod
    def measure(cls, name: str | None) -> str:
        """`name` (None: this kind's default) if it applies to this kind of policy; else a
        ValueError naming the measures that do."""
        name = name or next(iter(cls.DIVERGENCES))
        if name not in cls.DIVERGENCES:
            raise ValueError(
                f"divergence {name!r} does not apply to {cls.kind} policies; "
                f"choose {', '.join(cls.DIVERGENCES)}"
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


BEHAVIOURS: dict[str, type[Behaviour]] = {b.kind: b for b in (EpsilonGreedy, Categorical)}
# Every divergence some kind of policy has (a sync spec naming another one is refused as unknown).
MEASURES: frozenset[str] = frozenset(m for b in BEHAVIOURS.values() for m in b.DIVERGENCES)
