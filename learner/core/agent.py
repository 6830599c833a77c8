"""What the run asks of an agent, as small interfaces (Acme's core.py): a `Saveable` component,
the agent's `Learner`, and the `Agent` its builder hands the run.

The run (learner/run/) sees only these: no agent's module is imported outside its own folder
and the registry (learner/agents.py).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from clusterenv.learner.replay.rate_limiter import RateLimiter
from clusterenv.pipeline.behaviour import Behaviour
from clusterenv.pipeline.codec import ArraySpec

# A component's checkpointable state: arrays (stored as tensors) and JSON-able values.
State = tuple[dict[str, np.ndarray], dict[str, Any]]


class Saveable(Protocol):
    """A component that saves and restores its own state (Acme's Saveable)."""

    def save(self) -> State: ...

    def restore(self, arrays: Mapping[str, np.ndarray], values: Mapping[str, Any]) -> None: ...


class Learner(Saveable, Protocol):
    """An agent's learning side: chunks in, updates, weights out. `save` covers everything it
    owns (networks, optimizers, generators, schedules, buffers)."""

    updates: int  # learner updates so far: gradient steps (DQN) or PPO updates

    def insert(self, header: dict[str, Any], arrays: dict[str, np.ndarray]) -> int:
        """Store one accepted chunk (from the ingest thread); the rows stored."""
        ...

    def step(self) -> bool:
        """One update if the data allows; whether it ran."""
        ...

    def collected(self, env_steps: int) -> None:
        """The env steps collected so far: schedules that follow collection (DQN's lr)."""
        ...

    def get_weights(self) -> dict[str, np.ndarray]:
        """The network workers act with (`layers.{i}.*`: learner/core/networks.py)."""
        ...

    def networks(self) -> dict[str, Any]:
        """Its torch networks by the prefix their parameters carry in checkpoints (final.safetensors
        holds these alone)."""
        ...

    def metrics(self) -> dict[str, float | int | None]:
        """Namespaced figures for the metrics rows (losses/…, learner/…, pipeline/…)."""
        ...


@dataclass
class Agent:
    """A built agent: its learner and what the run must tell the workers and dispatch."""

    learner: Learner
    limiter: RateLimiter  # dispatch asks it whether collection may run further ahead
    publish_every: int  # learner updates between published versions
    # How workers act on chunks dispatched at an env-step count with a number of actor envs live
    # (pipeline/behaviour.py: ε-greedy with its ε, a ladder of ε over the actor envs,
    # categorical), sent in every ChunkRequest.
    behaviour: Callable[[int, int], Behaviour]
    max_lag_versions: int  # the APS version guard the workers are sent (0: none)
    extra_specs: dict[str, ArraySpec] = field(default_factory=dict)  # arrays beyond transitions
    # ChunkRequest fields the agent sets in every request (DQN's worker-computed priorities).
    task_fields: dict[str, Any] = field(default_factory=dict)
    # Columns the learner adds to each probe row for the `value` measure, from what never leaves
    # it, given the reference states and the published outputs on them (SAC's critics).
    value_probe: Callable[[np.ndarray, np.ndarray], np.ndarray] | None = None
