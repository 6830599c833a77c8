"""Small fakes and pure helpers for unit tests of pure logic (no server, no workers).

The fakes implement the role interfaces of pipeline/roles.py (or the plain callables a class is
built from), so sync rules, the Dispatcher, `collect_chunk` and `RunCache` can be tested without
Redis; the broker's roles as the learner sees them, in process, are in tests/inprocess.py. Tests of
anything that talks to Redis or Celery use the real server and workers of tests/conftest.py
instead.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import redis

from clusterenv.pipeline.behaviour import Behaviour
from clusterenv.pipeline.codec import ArraySpec
from clusterenv.pipeline.policy import NumpyMLP
from clusterenv.pipeline.roles import IngestStats
from clusterenv.pipeline.spaces import DiscreteActions, SpaceSpecs

# Reference states and a small CartPole-shaped net, shared by the sync tests.
REF = np.random.default_rng(1).normal(size=(64, 4)).astype(np.float32)
# CartPole's observation and action as chunks carry them (what REF and `net` fit).
CARTPOLE = SpaceSpecs(ArraySpec("<f4", (4,)), DiscreteActions(2))


def net(seed: int) -> dict[str, np.ndarray]:
    """Weights of a 4-16-2 MLP, different for every seed."""
    rng = np.random.default_rng(seed)
    return {
        "layers.0.weight": rng.normal(size=(16, 4)).astype(np.float32),
        "layers.0.bias": np.zeros(16, np.float32),
        "layers.1.weight": rng.normal(size=(2, 16)).astype(np.float32),
        "layers.1.bias": np.zeros(2, np.float32),
    }


# (out channels, kernel, stride) of each convolution; the shapes of learner/core/networks.py.
NATURE = ((32, 8, 4), (64, 4, 2), (64, 3, 1))
MINATAR = ((16, 3, 1),)


def conv_weights(
    shape: tuple[int, int, int], convs=MINATAR, dense=(128,), outputs: int = 3,
    scale: float = 1.0, seed: int = 0,
) -> dict[str, np.ndarray]:  # fmt: skip
    """Random weights of the contract for observations of `shape`."""
    rng = np.random.default_rng(seed)
    w = {"input.shape": np.array(shape, np.int64), "input.scale": np.array([scale], np.float32)}
    c, h, wd = shape
    for i, (out, k, s) in enumerate(convs):
        w[f"conv.{i}.weight"] = (rng.normal(size=(out, c, k, k)) / np.sqrt(c * k * k)).astype(
            np.float32
        )
        w[f"conv.{i}.bias"] = rng.normal(scale=0.1, size=out).astype(np.float32)
        w[f"conv.{i}.stride"] = np.array([s], np.int64)
        c, h, wd = out, (h - k) // s + 1, (wd - k) // s + 1
    sizes = [c * h * wd, *dense, outputs]
    for i, (a, b) in enumerate(zip(sizes[:-1], sizes[1:], strict=True)):
        w[f"layers.{i}.weight"] = (rng.normal(size=(b, a)) / np.sqrt(a)).astype(np.float32)
        w[f"layers.{i}.bias"] = rng.normal(scale=0.1, size=b).astype(np.float32)
    return w


def url_of(client: redis.Redis) -> str:
    """The redis:// URL a client is connected to (to open a second, blocking connection)."""
    kw = client.connection_pool.connection_kwargs
    return f"redis://{kw['host']}:{kw['port']}/{kw.get('db', 0)}"


class FakeClock:
    """A monotonic clock that only moves when told to."""

    def __init__(self, now: float = 1000.0):
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


class RecordingSend:
    """A `send(task_name, kwargs)` that records what it was asked to send."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, dict[str, Any]]] = []

    def __call__(self, name: str, kwargs: dict[str, Any]) -> None:
        self.sent.append((name, kwargs))


class Counter:
    """A settable zero-argument callable that counts its calls (e.g. `alive_processes`)."""

    def __init__(self, value: int):
        self.value, self.calls = value, 0

    def __call__(self) -> int:
        self.calls += 1
        return self.value


@dataclass
class FakeSyncState:
    """A SyncState with every input of a rule settable; records the divergences asked for."""

    version: int | None = 0
    steps_since_fetch: int = 0
    own_version_stored: bool = True
    seconds: float = 0.0
    divergence: float | None = 0.0
    asked: list[tuple[int, Behaviour, str]] = field(default_factory=list)

    def seconds_since_fetch(self) -> float:
        return self.seconds

    def divergence_to(self, version: int, behaviour: Behaviour, measure: str) -> float | None:
        self.asked.append((version, behaviour, measure))
        return self.divergence


class FakeWeightClient:
    """A WeightClient holding one fixed policy; counts syncs and recorded steps."""

    def __init__(
        self,
        weights: Mapping[str, np.ndarray],
        version: int = 0,
        divergence: float | None = None,
    ):
        self.policy = NumpyMLP(weights)
        self.version: int | None = version
        self.steps_since_fetch = 0
        self.own_version_stored = True
        self.run_stopped = False
        self.last_divergence: float | None = None
        self._divergence = divergence
        self.syncs: list[Behaviour] = []  # the behaviour of each sync call
        self.counters = {"version_checks": 0, "weight_fetches": 0, "weight_bytes": 0}

    def sync(self, behaviour: Behaviour) -> NumpyMLP:
        self.syncs.append(behaviour)
        self.counters["version_checks"] += 1
        self.last_divergence = self._divergence
        return self.policy

    def record_steps(self, env_steps: int) -> None:
        self.steps_since_fetch += env_steps

    def counters_json(self) -> dict[str, int]:
        return dict(self.counters)

    def seconds_since_fetch(self) -> float:
        return 0.0

    def divergence_to(self, version: int, behaviour: Behaviour, measure: str) -> float | None:
        return self._divergence


class FakeWriter:
    """A TransitionWriter that keeps what it was given; reports the arrays' bytes as written."""

    def __init__(self) -> None:
        self.written: list[tuple[dict[str, Any], dict[str, np.ndarray]]] = []

    def write(self, header: Mapping[str, Any], arrays: Mapping[str, np.ndarray]) -> int:
        self.written.append((dict(header), {k: np.array(v) for k, v in arrays.items()}))
        return sum(np.asarray(v).nbytes for v in arrays.values())


class FakeActor:
    """Stands in for a chunks.actor.Actor where only closing matters (RunCache)."""

    def __init__(self) -> None:
        self.closed = 0

    def close(self) -> None:
        self.closed += 1


class FakeSlots:
    """A SlotLease without a server: always `slot`; counts releases."""

    def __init__(self, slot: int = 0) -> None:
        self.slot, self.released = slot, 0

    def claim(self) -> int:
        return self.slot

    def release(self) -> None:
        self.released += 1


class FakeWeightSource:
    """A WeightSource that keeps in memory, for a test to read back, every version it was given
    (`published`), its probe (`probes`, None without one) and every batch of reference states
    (`references`), numbered as RedisWeightSource numbers them."""

    def __init__(self) -> None:
        self.version = -1
        self.reference_version = -1
        self.reference: np.ndarray | None = None
        self.published: dict[int, dict[str, np.ndarray]] = {}
        self.probes: dict[int, np.ndarray | None] = {}
        self.references: dict[int, np.ndarray] = {}

    def publish_reference(self, states: np.ndarray) -> int:
        self.reference_version += 1
        self.reference = np.array(states)
        self.references[self.reference_version] = self.reference
        return self.reference_version

    def publish(self, tensors: Mapping[str, np.ndarray], probe_q: np.ndarray | None = None) -> int:
        self.version += 1
        self.published[self.version] = {k: np.array(v) for k, v in tensors.items()}
        self.probes[self.version] = None if probe_q is None else np.array(probe_q)
        return self.version


class FlakyReader:
    """A TransitionReader whose first `failures` polls raise `error`; the next poll hands every
    chunk in `chunks` (header, arrays) to the sink. Records when each poll came, and the idle
    time of each claim."""

    def __init__(self, failures: int, error: Exception, chunks: list) -> None:
        self.failures, self.error, self.chunks = failures, error, list(chunks)
        self.polls: list[float] = []
        self.stats = IngestStats()  # never counted: the tests of it look at the sink
        self.seen: set[int] = set()
        self.claims: list[int] = []

    def poll(self, sink: Any, block_ms: int = 100, count: int = 64) -> int:
        self.polls.append(time.monotonic())
        if len(self.polls) <= self.failures:
            raise self.error
        rows = 0
        while self.chunks:
            header, arrays = self.chunks.pop(0)
            sink(header, arrays)
            rows += len(arrays["action"])
        time.sleep(block_ms / 1000)
        return rows

    def claim_stale(self, sink: Any, min_idle_ms: int, count: int = 64) -> int:
        self.claims.append(min_idle_ms)
        return 0
