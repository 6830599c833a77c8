"""Task arguments checked field by field: ChunkRequest and ShardSpec from JSON (no server)."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

from clusterenv.pipeline.behaviour import Categorical, EnvEpsilons, EpsilonGreedy, EpsilonLadder
from clusterenv.pipeline.chunks.request import ChunkRequest
from clusterenv.pipeline.remote_env.messages import ShardSpec
from clusterenv.pipeline.task_args import TaskArgsError

REQ = ChunkRequest(
    "run-t", 4, "CartPole-v1", 2, 8, seed=1, behaviour=EpsilonGreedy(0.25), env_kwargs={"g": 9.8}
)
SPEC = ShardSpec("sess", 1, "CartPole-v1", [2, 3], heartbeat_ttl_s=3.0, idle_timeout_s=300.0)


def refused(cls, data) -> str:
    with pytest.raises(TaskArgsError) as exc:
        cls.from_json(data)
    message = str(exc.value)
    assert "\n" not in message  # one line, fit for a log or a task failure
    return message


@pytest.mark.parametrize(
    "cls, changes, names",
    [
        (ChunkRequest, {"sync": 3}, ["ChunkRequest.sync", "a string", "int 3"]),
        (ChunkRequest, {"num_envs": True}, ["ChunkRequest.num_envs", "an integer", "bool"]),
        (ChunkRequest, {"chunk_id": 4.0}, ["ChunkRequest.chunk_id", "an integer", "float"]),
        (
            ChunkRequest,
            {"behaviour": {"kind": "epsilon_greedy", "epsilon": "0.1"}},
            ["ChunkRequest.behaviour.epsilon", "a finite number", "str"],
        ),
        (
            ChunkRequest,
            {"behaviour": {"kind": "epsilon_greedy", "epsilon": False}},
            ["ChunkRequest.behaviour.epsilon", "a finite number", "bool"],
        ),
        (
            ChunkRequest,
            {"behaviour": {"kind": "gaussian", "std": 1.0}},
            [
                "ChunkRequest.behaviour.kind",
                "epsilon_greedy, epsilon_ladder, categorical",
                "'gaussian'",
            ],
        ),
        (ChunkRequest, {"behaviour": {}}, ["ChunkRequest.behaviour.kind", "None"]),
        (ChunkRequest, {"behaviour": 0.1}, ["ChunkRequest.behaviour", "a JSON object", "float"]),
        (
            ChunkRequest,
            {"behaviour": {"kind": "categorical", "epsilon": 0.1}},
            ["unknown ChunkRequest.behaviour fields: epsilon"],
        ),
        (
            ChunkRequest,
            {"behaviour": {"kind": "epsilon_greedy"}},
            ["ChunkRequest.behaviour", "missing", "'epsilon'"],
        ),
        (ChunkRequest, {"run_id": None}, ["ChunkRequest.run_id", "a string", "null"]),
        (ChunkRequest, {"env_kwargs": [1]}, ["ChunkRequest.env_kwargs", "a JSON object", "list"]),
        (ShardSpec, {"env_indices": ["0", "1"]}, ["ShardSpec.env_indices", "a list of integers"]),
        (ShardSpec, {"env_indices": 3}, ["ShardSpec.env_indices", "a list of integers", "int"]),
        (
            ShardSpec,
            {"heartbeat_ttl_s": "3"},
            ["ShardSpec.heartbeat_ttl_s", "a finite number", "str"],
        ),
        (
            ShardSpec,
            {"idle_timeout_s": float("nan")},
            ["ShardSpec.idle_timeout_s", "a finite number", "float nan"],
        ),
        (ShardSpec, {"shard": True}, ["ShardSpec.shard", "an integer", "bool"]),
    ],
)
def test_wrong_types_are_refused_naming_the_field(cls, changes, names):
    base = REQ if cls is ChunkRequest else SPEC
    message = refused(cls, base.to_json() | changes)
    for part in names:
        assert part in message, message


@pytest.mark.parametrize("cls, base", [(ChunkRequest, REQ), (ShardSpec, SPEC)])
def test_a_missing_required_field_is_named(cls, base):
    data = base.to_json()
    del data["env_id"]
    message = refused(cls, data)
    assert cls.__name__ in message and "env_id" in message


@pytest.mark.parametrize("data, got", [([1, 2], "list"), (None, "null"), ("{}", "str")])
def test_non_objects_are_refused(data, got):
    message = refused(ChunkRequest, data)
    assert message == f"ChunkRequest: expected a JSON object, got {got}"


def test_unknown_fields_are_named():
    message = refused(ShardSpec, SPEC.to_json() | {"pickle": True, "exec": 1})
    assert message == "unknown ShardSpec fields: exec, pickle"


def test_ints_are_accepted_for_floats():
    greedy = {"kind": "epsilon_greedy", "epsilon": 1}
    req = ChunkRequest.from_json(REQ.to_json() | {"behaviour": greedy, "max_lag_seconds": 5})
    assert req.behaviour.epsilon == 1 and req.max_lag_seconds == 5
    spec = ShardSpec.from_json(SPEC.to_json() | {"heartbeat_ttl_s": 2, "idle_timeout_s": 60})
    assert spec.heartbeat_ttl_s == 2 and spec.idle_timeout_s == 60


def test_optional_fields_take_their_defaults():
    data = {k: v for k, v in REQ.to_json().items() if k not in ("sync", "env_kwargs")}
    req = ChunkRequest.from_json(data)
    assert req.sync == ChunkRequest.__dataclass_fields__["sync"].default
    assert req.env_kwargs == {}


@pytest.mark.parametrize("args", [REQ, SPEC])
def test_round_trip_through_json(args):
    wire = json.loads(json.dumps(args.to_json()))
    assert type(args).from_json(wire) == args
    assert type(args).from_json(wire).to_json() == args.to_json()


@pytest.mark.parametrize(
    "changes, part",
    [
        ({"steps": 0}, "num_envs and steps must be >= 1"),
        (
            {"behaviour": {"kind": "epsilon_greedy", "epsilon": 1.5}},
            "ChunkRequest.behaviour: epsilon must be in [0, 1]",
        ),
        ({"sync": "aps:0.1:value", "behaviour": {"kind": "categorical"}}, "does not apply to"),
        ({"max_lag_versions": -1}, "must be >= 0"),
        ({"sync": "sometimes"}, "unknown sync policy 'sometimes'"),
        (
            {"behaviour": {"kind": "epsilon_ladder", "epsilon": 0.4, "alpha": 7.0, "size": 0}},
            "ChunkRequest.behaviour: size must be >= 1",
        ),
        (
            {"behaviour": {"kind": "epsilon_ladder", "epsilon": 0.4, "alpha": -1.0, "size": 8}},
            "alpha must be >= 0",
        ),
        ({"behaviour": {"kind": "env_epsilons", "epsilons": [0.1]}}, "kind must be one of"),
    ],
)
def test_well_typed_but_bad_values_are_refused_by_check(changes, part):
    assert part in refused(ChunkRequest, REQ.to_json() | changes)


@pytest.mark.parametrize(
    "behaviour, wire",
    [
        (EpsilonGreedy(0.05), {"kind": "epsilon_greedy", "epsilon": 0.05}),
        (Categorical(), {"kind": "categorical"}),
        (
            EpsilonLadder(0.4, 7.0, 16),
            {"kind": "epsilon_ladder", "epsilon": 0.4, "alpha": 7.0, "size": 16},
        ),
    ],
)
def test_behaviour_values_travel_as_one_json_object(behaviour, wire):
    data = REQ.to_json() | {"behaviour": wire}
    assert ChunkRequest.from_json(data).behaviour == behaviour
    assert dataclasses.replace(REQ, behaviour=behaviour).to_json()["behaviour"] == wire


def test_epsilon_is_kept_to_six_decimals():
    assert EpsilonGreedy(0.123456789) == EpsilonGreedy(0.123457)


def test_task_args_errors_are_value_errors():
    assert issubclass(TaskArgsError, ValueError)


def test_a_ladder_gives_each_actor_env_apexs_epsilon():
    ladder = EpsilonLadder(0.4, 7.0, 8)
    eps = ladder.epsilons(0, 8)
    np.testing.assert_allclose(eps, [0.4 ** (1 + 7 * i / 7) for i in range(8)])
    assert eps[0] == pytest.approx(0.4) and eps[-1] == pytest.approx(0.4**8)
    assert (np.diff(eps) < 0).all()
    # Actor 3 of 3 envs each: envs 9, 10, 11 of the run, slots 1, 2, 3 of a ladder of 8.
    bound = ladder.for_actor(3, 3)
    assert bound == ladder.for_actor(3, 3) and isinstance(bound, EnvEpsilons)
    np.testing.assert_allclose(bound.epsilons, eps[[1, 2, 3]], rtol=1e-5)
    assert EpsilonGreedy(0.1).for_actor(3, 3) == EpsilonGreedy(0.1)


def test_each_env_of_an_actor_explores_at_its_own_epsilon():
    rng, q = np.random.default_rng(0), np.tile([[0.0, 1.0, 0.0, 0.0]], (3, 1))
    bound = EnvEpsilons((1.0, 0.2, 0.0))
    actions = np.stack([bound.act(q, rng)[0] for _ in range(4000)])
    off_greedy = (actions != 1).mean(axis=0)  # a uniform action is greedy 1 time in 4
    np.testing.assert_allclose(off_greedy, [0.75, 0.15, 0.0], atol=0.03)
    with pytest.raises(TypeError, match="for_actor"):
        EpsilonLadder(0.4, 7.0, 8).act(q, rng)
