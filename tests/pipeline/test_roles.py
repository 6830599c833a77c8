"""The role interfaces of pipeline/roles.py: the Redis classes and the test fakes both fit them.

Without a type checker in the test run, this keeps a renamed method or attribute from leaving a
fake (and so the unit tests built on it) silently out of step with the real implementation.
"""

from __future__ import annotations

import inspect

import pytest
import redis

from clusterenv.pipeline.chunks.stream import StreamReader, StreamWriter
from clusterenv.pipeline.cluster.registry import WorkerRegistry
from clusterenv.pipeline.cluster.run_flags import RedisRunFlags
from clusterenv.pipeline.cluster.status_board import RedisStatusBoard
from clusterenv.pipeline.evaluation.results import RedisEvalResults
from clusterenv.pipeline.keys import RunKeys
from clusterenv.pipeline.roles import (
    EvalResults,
    RunFlags,
    StatusBoard,
    SyncRule,
    SyncState,
    TransitionReader,
    TransitionWriter,
    WeightClient,
    WeightSource,
    WorkerDirectory,
)
from clusterenv.pipeline.sync.client import RedisWeightClient
from clusterenv.pipeline.sync.rules import Always, Aps, Interval, OnChange
from clusterenv.pipeline.sync.source import RedisWeightSource
from tests.fakes import (
    CARTPOLE,
    FakeSyncState,
    FakeWeightClient,
    FakeWeightSource,
    FakeWriter,
    FlakyReader,
    net,
)
from tests.inprocess import (
    FakeEvalResults,
    FakeRunFlags,
    FakeStatusBoard,
    FakeTransitions,
    FakeWorkerDirectory,
)

KEYS = RunKeys("roles")


def members(protocol: type) -> tuple[set[str], dict[str, inspect.Signature]]:
    """A Protocol's attributes (annotations) and methods (with signatures), bases included."""
    attrs: set[str] = set()
    methods: dict[str, inspect.Signature] = {}
    for klass in reversed(protocol.__mro__):
        if klass is object or klass.__module__ == "typing":
            continue
        attrs |= set(klass.__dict__.get("__annotations__", {}))
        for name, value in vars(klass).items():
            if inspect.isfunction(value) and not name.startswith("_"):
                methods[name] = inspect.signature(value)
    return attrs, methods


def params(sig: inspect.Signature) -> list[str]:
    return [p for p in sig.parameters if p != "self"]


CASES = [
    (WeightClient, lambda: RedisWeightClient(redis.Redis(), KEYS, Always(), CARTPOLE.obs)),
    (WeightClient, lambda: FakeWeightClient(net(0))),
    (SyncState, lambda: RedisWeightClient(redis.Redis(), KEYS, Always(), CARTPOLE.obs)),
    (SyncState, FakeSyncState),
    (WeightSource, lambda: RedisWeightSource(None, KEYS)),
    (WeightSource, FakeWeightSource),
    (TransitionWriter, lambda: StreamWriter(None, KEYS)),
    (TransitionWriter, FakeWriter),
    (TransitionWriter, FakeTransitions),
    (TransitionReader, FakeTransitions),
    (TransitionReader, lambda: FlakyReader(0, RuntimeError(), [])),
    (RunFlags, lambda: RedisRunFlags(None, KEYS)),
    (RunFlags, FakeRunFlags),
    (WorkerDirectory, lambda: WorkerRegistry(None)),
    (WorkerDirectory, FakeWorkerDirectory),
    (EvalResults, lambda: RedisEvalResults(None, KEYS)),
    (EvalResults, FakeEvalResults),
    (StatusBoard, lambda: RedisStatusBoard(None)),
    (StatusBoard, FakeStatusBoard),
    (SyncRule, Always),
    (SyncRule, OnChange),
    (SyncRule, lambda: Interval(steps=8)),
    (SyncRule, lambda: Aps(tolerance=0.1)),
]


@pytest.mark.parametrize(
    "protocol, make", CASES, ids=[f"{p.__name__}-{i}" for i, (p, _) in enumerate(CASES)]
)
def test_implementations_have_every_member_of_their_role(protocol, make):
    obj = make()
    attrs, methods = members(protocol)
    assert attrs or methods
    for name in attrs:
        assert hasattr(obj, name), f"{type(obj).__name__} lacks attribute {name!r}"
    for name, sig in methods.items():
        impl = getattr(type(obj), name, None)
        assert callable(impl), f"{type(obj).__name__} lacks method {name!r}"
        assert params(inspect.signature(impl)) == params(sig), (type(obj).__name__, name)


def test_stream_reader_fits_transition_reader(client, run_id):
    attrs, methods = members(TransitionReader)
    for name, sig in methods.items():
        assert params(inspect.signature(getattr(StreamReader, name))) == params(sig)
    reader = StreamReader(client, RunKeys(run_id), CARTPOLE)
    assert attrs == {"stats", "seen"}
    assert reader.stats.chunks == 0 and reader.seen == set()


def test_the_members_helper_sees_inherited_members():
    attrs, methods = members(WeightClient)
    assert {"version", "steps_since_fetch", "own_version_stored", "last_divergence"} <= attrs
    assert {"sync", "record_steps", "counters_json", "divergence_to"} <= set(methods)
