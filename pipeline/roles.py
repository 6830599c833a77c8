"""The roles the pipeline is built from, as small interfaces (in Acme's manner).

Learner side: a `WeightSource` publishes policy versions (and probes); a `TransitionReader` takes
chunks off the wire into a sink. Worker side: a `WeightClient` holds one version and decides per
chunk, with its `SyncRule`, whether to fetch a newer one; a `TransitionWriter` puts chunks on the
wire. The learner's other broker seams: `RunFlags` (the run's start marker and stop flag), a
`WorkerDirectory` (who is alive), `EvalResults` (evaluation parts coming back) and a `StatusBoard`
(every run's progress). The Redis implementations live in pipeline/sync/, pipeline/chunks/stream.py,
pipeline/cluster/ and pipeline/evaluation/results.py; tests use the small fakes in tests/fakes.py
and, for the learner's side, tests/inprocess.py, which tests/pipeline/test_broker_roles.py holds to
the same behaviour as their Redis twins.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from clusterenv.pipeline.behaviour import Behaviour
from clusterenv.pipeline.policy import NumpyPolicy

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

    def sync(self, behaviour: Behaviour) -> NumpyPolicy | None:
        """The policy for the next chunk, to act with as `behaviour` says; None once the run has
        stopped (`run_stopped`)."""
        ...

    def record_steps(self, env_steps: int) -> None: ...

    def counters_json(self) -> dict[str, int]: ...


class TransitionWriter(Protocol):
    """Worker side: puts one chunk (header + arrays) on the wire, or holds it for the next round
    trip (pipeline/outbox.py); returns the bytes it makes."""

    def write(self, header: Mapping[str, Any], arrays: Mapping[str, np.ndarray]) -> int: ...


class SlotLease(Protocol):
    """Worker side: this process's actor slot in a run (pipeline/chunks/slots.py)."""

    def claim(self) -> int:
        """The slot this process holds, claiming the lowest free or dead one first."""
        ...

    def release(self) -> None:
        """Give the slot back (the process stops serving the run)."""
        ...


@dataclass
class IngestStats:
    """What a TransitionReader has done with the chunks it read, cumulative."""

    chunks: int = 0
    transitions: int = 0
    duplicates: int = 0
    claimed: int = 0
    rejected: int = 0
    rejected_reasons: dict[str, int] = field(default_factory=dict)


class TransitionReader(Protocol):
    """Learner side: hands each good, not yet seen chunk to `sink`; returns transitions accepted."""

    stats: IngestStats  # chunks, transitions, duplicates, claimed, rejected (and why) so far
    seen: set[int]  # the ids of the chunks accepted so far: one seen again is a duplicate

    def poll(self, sink: Sink, block_ms: int = 100, count: int = 64) -> int: ...

    def claim_stale(self, sink: Sink, min_idle_ms: int, count: int = 64) -> int:
        """Like `poll`, for chunks a reader took but never acknowledged for `min_idle_ms` (it died
        meanwhile); the learner claims them after the dispatcher's write-off time."""
        ...


class RunFlags(Protocol):
    """Learner side: the run's marks on the broker, and whether the broker still holds them."""

    def mark_started(self) -> None:
        """Mark the run started; a broker that later lacks the mark lost the run's keys."""
        ...

    def mark_stopped(self) -> None:
        """Flag the run stopped (queued chunks return at once, workers drop its envs) and let its
        keys expire after RUN_KEYS_TTL_S."""
        ...

    def lost(self) -> bool:
        """True when the broker no longer holds the start mark (restarted without persistence)."""
        ...


class WorkerDirectory(Protocol):
    """Learner side of the worker registry: how many worker processes are alive, and who."""

    def alive_processes(self, eval_only: bool = False) -> int:
        """Processes of live workers that collect, or with `eval_only` of those that only evaluate."""
        ...

    def is_alive(self, hostname: str) -> bool:
        """Whether the worker registered as `hostname` still has a live heartbeat."""
        ...


class EvalResults(Protocol):
    """Learner side of evaluation: the parts' results coming back, and who took each part."""

    def pop(self) -> bytes | None:
        """The oldest unread result (JSON bytes), or None."""
        ...

    def unread(self) -> int: ...

    def takers(self, fields: list[str]) -> list[str]:
        """The hostnames that took the parts `fields` ("{eval id}:{part}"), in that order; parts
        nobody took are skipped."""
        ...

    def forget(self, fields: list[str]) -> None:
        """Drop the takers of the parts `fields` (their evaluation is done or given up)."""
        ...


class ChunkTakers(Protocol):
    """Learner side of who took which chunk (workers note it as they receive a task)."""

    def takers(self, chunk_ids: list[int]) -> dict[int, str]:
        """The hostname that took each of `chunk_ids`; chunks nobody took yet are left out."""
        ...

    def forget(self, chunk_ids: list[int]) -> None:
        """Drop the takers of `chunk_ids` (arrived, or written off)."""
        ...


class StatusBoard(Protocol):
    """Every run's JSON status, for operators (`clusterenv status`)."""

    def write(self, run_id: str, status: Mapping[str, Any]) -> None:
        """Replace the status of `run_id`; it expires after RUN_KEYS_TTL_S unless written again.
        Raises the broker's error (connect.BROKER_ERRORS): best effort is the caller's business."""
        ...

    def read_all(self) -> list[dict[str, Any]]:
        """Every run's status, the most recently updated (`updated_at`) first."""
        ...
