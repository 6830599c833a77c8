"""Remote-env messages without a server: packed messages, info trees, space descriptions."""

from __future__ import annotations

import json

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import data_equivalence

from clusterenv.pipeline.codec import (
    CodecError,
    decode_tree,
    encode_tree,
    pack_message,
    unpack_message,
)
from clusterenv.pipeline.remote_env.messages import (
    STEP,
    EnvTarget,
    Message,
    ShardSpec,
    pack,
    unpack,
)
from clusterenv.pipeline.remote_env.values import Rows, kind_of, restore
from clusterenv.pipeline.spaces import from_leaves, leaves, space_from_tree, space_to_tree


def test_packed_message_round_trip() -> None:
    arrays = {
        "obs": np.arange(12, dtype=np.float32).reshape(3, 4),
        "done": np.array([1, 0, 1], bool),
    }
    header, got = unpack_message(pack_message({"seq": 4}, arrays))
    assert header["seq"] == 4
    for name, a in arrays.items():
        np.testing.assert_array_equal(got[name], a)
        assert got[name].dtype == a.dtype


@pytest.mark.parametrize(
    "mutate, match",
    [
        (lambda b: b[:2], "no header length"),
        (lambda b: b[:-1], "message too short"),
        (lambda b: b + b"x", "stray bytes"),
        (lambda b: b"\xff\x00\x00\x00" + b[4:], "runs past"),
        (lambda b: b.replace(b"<f4", b"|O8"), "cannot travel"),
    ],
)
def test_damaged_messages_are_refused(mutate, match: str) -> None:
    blob = pack_message({}, {"obs": np.zeros((2, 2), np.float32)})
    with pytest.raises(CodecError, match=match):
        unpack_message(mutate(blob))


TREES = [
    ({}, {}),
    ({"a": 1, "b": 2.5, "c": "x", "d": None, "e": True}, None),
    ({"t": np.int64(3), "f": np.float32(0.5), "ok": np.bool_(True)}, None),
    ({"arr": np.arange(6).reshape(2, 3), "zero_d": np.array(2.0)}, None),
    ({"nested": {"episode": {"r": np.float64(10.0), "l": 10}}}, None),
    ({"pair": (1, np.int8(2))}, None),
    ([{"x": 1}, {}], None),
    ({"obj": object}, {"obj": repr(object)}),
    ({"odd": {"$nd": 1}}, {"odd": repr({"$nd": 1})}),
]


@pytest.mark.parametrize("value, expected", TREES)
def test_tree_round_trip_keeps_numpy_types(value, expected) -> None:
    arrays: dict[str, np.ndarray] = {}
    tree = encode_tree(value, arrays)
    _, decoded = unpack_message(pack_message({"tree": tree}, arrays))
    got = decode_tree(tree, decoded)
    want = value if expected is None else expected
    assert data_equivalence(got, want, exact=True)


@pytest.mark.parametrize(
    "space",
    [
        gym.spaces.Box(-1.0, 1.0, shape=(3,), dtype=np.float32),
        gym.spaces.Box(low=np.array([0, -np.inf]), high=np.array([1, np.inf]), dtype=np.float64),
        gym.spaces.Box(0, 255, shape=(4, 4, 3), dtype=np.uint8),
        gym.spaces.Discrete(5, start=-2),
        gym.spaces.MultiDiscrete([3, 4]),
        gym.spaces.MultiBinary(6),
        gym.spaces.Dict({"b": gym.spaces.Discrete(3), "a": gym.spaces.Box(0, 1, (2,))}),
        gym.spaces.Tuple((gym.spaces.Discrete(2), gym.spaces.Tuple((gym.spaces.MultiBinary(3),)))),
    ],
)
def test_spaces_travel(space: gym.Space) -> None:
    arrays: dict[str, np.ndarray] = {}
    msg = Message(STEP, 1, [0], {"space": space_to_tree(space)}, arrays)
    assert space_from_tree(unpack(pack(msg)).tree["space"]) == space


def test_unsupported_space_is_named() -> None:
    tree = space_to_tree(gym.spaces.Dict({"a": gym.spaces.Text(5)}))
    with pytest.raises(NotImplementedError, match="Text"):
        space_from_tree(tree)


def test_shard_spec_checks_its_fields() -> None:
    spec = ShardSpec("s", 0, "CartPole-v1", [0, 1], heartbeat_ttl_s=3.0, idle_timeout_s=300.0)
    assert ShardSpec.from_json(spec.to_json()) == spec
    with pytest.raises(ValueError, match="unknown"):
        ShardSpec.from_json({**spec.to_json(), "pickle": True})
    with pytest.raises(ValueError, match="env_indices must not be empty"):
        ShardSpec.from_json({**spec.to_json(), "env_indices": []})
    with pytest.raises(ValueError, match="autoreset must be one of"):
        ShardSpec.from_json({**spec.to_json(), "autoreset": "Disabled"})
    with pytest.raises(ValueError, match="env_spec must be a JSON object or null"):
        ShardSpec.from_json({**spec.to_json(), "env_spec": "CartPole-v1"})
    # An EnvSpec rides as the JSON object of EnvSpec.to_json(), wrappers included.
    target = EnvTarget.of(gym.wrappers.ClipReward(gym.make("CartPole-v1"), 0.0, 0.5).spec)
    with_spec = ShardSpec(
        "s", 0, target.env_id, [0], 3.0, 300.0, env_spec=target.env_spec, autoreset="SameStep"
    )
    assert ShardSpec.from_json(json.loads(json.dumps(with_spec.to_json()))) == with_spec
    assert target.env_spec["additional_wrappers"][0]["name"] == "ClipReward"


@pytest.mark.parametrize(
    "value",
    [1, 2.5, True, np.int64(3), np.float32(0.5), np.bool_(False), np.arange(3, dtype=np.int8)],
)
def test_value_kinds_restore_the_type_from_a_batch_row(value) -> None:
    # A batch row is a numpy scalar or array of the column's dtype (float64 for rewards, say).
    row = np.asarray([value], dtype=np.float64)[0]
    assert data_equivalence(restore(row, kind_of(value)), value, exact=True)


def test_rows_pack_dict_and_tuple_observations_per_leaf() -> None:
    space = gym.spaces.Dict(
        {"a": gym.spaces.Discrete(4), "b": gym.spaces.Tuple((gym.spaces.Box(0, 1, (2,)),))}
    )
    space.seed(0)
    samples = [space.sample() for _ in range(3)]
    rows = Rows(space, 3, note_kinds=True)
    for j, s in enumerate(samples):
        rows.put(j, s, 1.0)
    msg = unpack(pack(rows.message(STEP, Message(STEP, 7, [0, 1, 2]), [{}] * 3, [])))
    assert msg.seq == 7 and sorted(msg.arrays) == ["obs0", "obs1"]
    assert msg.arrays["obs1"].shape == (3, 2) and msg.arrays["obs1"].dtype == np.float32
    assert msg.extra["kinds"] == [["s<i8", "a<f4", "f"]]  # one row stands for three equal ones
    batched = from_leaves(space, iter(msg.arrays[f"obs{k}"] for k in range(2)))
    assert gym.vector.utils.batch_space(space, 3).contains(batched)
    for j, s in enumerate(samples):
        got = from_leaves(space, iter(a[j] for a in leaves(space, batched)))
        assert data_equivalence(got, s, exact=True)
