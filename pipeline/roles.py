"""The roles the pipeline is built from, as small interfaces (in Acme's manner).

Learner side: a `WeightSource` publishes policy versions (and probes); a `TransitionReader` takes
chunks off the wire into a sink. Worker side: a `WeightClient` holds one version and decides per
chunk, with its `SyncRule`, whether to fetch a newer one; a `TransitionWriter` puts chunks on the
wire. The Redis implementations live in pipeline/sync/ and pipeline/chunks/stream.py; tests use
the small fakes in tests/fakes.py.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Protocol

import numpy as np

from clusterenv.pipeline.behaviour import Behaviour
from clusterenv.pipeline.policy import NumpyMLP

Sink = Callable[[dict[str, Any], dict[str, np.ndarray]], None]
# How the learner's dispatch and evaluation send a task: (task name, JSON kwargs).
SendTask = Callable[[str, dict[str, Any]], None]


class WeightSource(Protocol):
    """Learner side: publishes numbered weight versions, each with an optional probe."""

    version: int
    reference: np.ndarray | None

    def publish_reference(self, states: np.ndarray) -> int: ...

    def publish(
        self, tensors: Mapping[str, np.ndarray], probe_q: np.ndarray | None = None
    ) -> int: ...


class SyncState(Protocol):
    """What a sync rule may look at on a weight client."""

    version: int | None
    steps_since_fetch: int
    own_version_stored: bool

    def seconds_since_fetch(self) -> float: ...

    def divergence_to(self, version: int, behaviour: Behaviour, measure: str) -> float | None:
        """Divergence `measure` of how `behaviour` acts with the held policy and with `version`."""
        ...


class SyncRule(Protocol):
    """Decides, once per chunk, whether a client fetches the weights of version `latest`."""

    def should_fetch(self, client: SyncState, latest: int, behaviour: Behaviour) -> bool: ...


class WeightClient(SyncState, Protocol):
    """Worker side: the policy of one version, refreshed when its rule says so."""

    last_divergence: float | None
    run_stopped: bool

    def sync(self, behaviour: Behaviour) -> NumpyMLP | None:
        """The policy for the next chunk, to act with as `behaviour` says; None once the run has
        stopped (`run_stopped`)."""
        ...

    def record_steps(self, env_steps: int) -> None: ...

    def counters_json(self) -> dict[str, int]: ...


class TransitionWriter(Protocol):
    """Worker side: puts one chunk (header + arrays) on the wire, or holds it for the next round
    trip (pipeline/outbox.py); returns the bytes it makes."""

    def write(self, header: Mapping[str, Any], arrays: Mapping[str, np.ndarray]) -> int: ...


class TransitionReader(Protocol):
    """Learner side: hands each good, not yet seen chunk to `sink`; returns transitions accepted."""

    def poll(self, sink: Sink, block_ms: int = 100, count: int = 64) -> int: ...

    def claim_stale(self, sink: Sink, min_idle_ms: int, count: int = 64) -> int:
        """Like `poll`, for chunks a reader took but never acknowledged for `min_idle_ms` (it died
        meanwhile); the learner claims them after the dispatcher's write-off time."""
        ...
