"""Property tests of the pure decoders: any input is either decoded or refused with the decoder's
own named error (CodecError, TaskArgsError, ValueError for weights); nothing else ever escapes."""

from __future__ import annotations

import contextlib
import json
import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from clusterenv.pipeline.behaviour import EpsilonGreedy
from clusterenv.pipeline.chunks.request import ChunkRequest
from clusterenv.pipeline.chunks.stream import check_content, transition_specs
from clusterenv.pipeline.codec import (
    CodecError,
    decode_chunk,
    decode_tree,
    decode_weights,
    encode_weights,
    unpack_message,
)
from clusterenv.pipeline.evaluation.request import EvalRequest
from clusterenv.pipeline.policy import load_policy
from clusterenv.pipeline.remote_env.messages import (
    STEP,
    Message,
    ShardSpec,
    pack,
    request_problem,
    unpack,
)
from clusterenv.pipeline.task_args import TaskArgsError
from tests.bad_input import SPACES, bad_entry, entry, json_values
from tests.fakes import conv_weights, net

SPECS = transition_specs(SPACES)
FAST = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def accept(fields: dict[bytes, bytes], run_id: str = "run-f") -> tuple[dict, dict]:
    """What the learner's StreamReader does with one entry before replay."""
    header, arrays = decode_chunk(fields, SPECS)
    check_content(header, arrays, run_id, SPACES.action)
    return header, arrays


@FAST
@given(bad_entry("run-f", 3))
def test_every_broken_entry_is_refused_with_a_named_reason(fields):
    with pytest.raises(CodecError) as info:
        accept(fields)
    assert str(info.value)  # the reason the reader counts


@FAST
@given(st.integers(1, 64), st.integers(0, 2**62))
def test_valid_entries_are_accepted(rows, chunk):
    header, arrays = accept(entry("run-f", chunk, rows, 0.5))
    assert header["chunk"] == chunk and len(arrays["action"]) == rows


@FAST
@given(st.dictionaries(st.binary(max_size=12), st.binary(max_size=64), max_size=8))
def test_arbitrary_fields_never_escape_the_codec(fields):
    with pytest.raises(CodecError):
        accept(fields)


@FAST
@given(st.binary(max_size=200))
def test_arbitrary_messages_decode_or_raise_codec_error(blob):
    with contextlib.suppress(CodecError):
        unpack_message(blob)


@FAST
@given(st.data())
def test_damaged_messages_decode_or_raise_codec_error(data):
    tree = {"x": np.arange(3.0), "t": (1, "a"), "s": np.int64(4)}
    msg = Message(STEP, 3, [0, 1], tree, {"action": np.arange(2)}, {"seeds": [1, None]})
    blob = bytearray(pack(msg))
    for _ in range(data.draw(st.integers(1, 4))):
        blob[data.draw(st.integers(0, len(blob) - 1))] = data.draw(st.integers(0, 255))
    try:
        got = unpack(bytes(blob[: data.draw(st.integers(0, len(blob)))]))
    except CodecError:
        return
    assert all(type(i) is int for i in got.envs) and type(got.seq) is int
    request_problem(got)  # a shard's check of what decoded never raises either


# JSON whose objects use the tree's own tags ($nd, $tuple, ...) with any values.
trees = st.recursive(
    json_values,
    lambda inner: (
        st.dictionaries(
            st.sampled_from(["$nd", "$tuple", "$repr", "shape", "scalar", "k"]),
            inner | st.just("t0"),
            max_size=3,
        )
        | st.lists(inner, max_size=3)
    ),
    max_leaves=10,
)


@FAST
@given(trees, st.dictionaries(st.sampled_from(["t0", "t1"]), st.just(np.arange(4.0))))
def test_arbitrary_trees_decode_or_raise_codec_error(tree, arrays):
    with contextlib.suppress(CodecError):
        decode_tree(tree, arrays)


# --- weight blobs, as a worker reads them ---


@FAST
@given(st.binary(max_size=300))
def test_arbitrary_bytes_are_no_policy(blob):
    with pytest.raises(CodecError):
        decode_weights(blob)


def _valid_or_refused(blob: bytes) -> None:
    try:
        policy = load_policy(blob)
    except ValueError as exc:  # CodecError for bytes, ValueError for layers: both name the problem
        assert str(exc)
        return
    # What loads must act: a finite Q row per observation of its input shape.
    obs = np.zeros((2, *policy.input_shape), np.float32)
    assert np.isfinite(policy(obs)).all()


# An MLP's, and a small conv net's (the names and integers of the contract's conv part).
BLOBS = [encode_weights(net(0)), encode_weights(conv_weights((2, 5, 5), dense=(4,)))]


@FAST
@given(st.data())
def test_damaged_weight_blobs_load_or_are_refused(data):
    blob = bytearray(data.draw(st.sampled_from(BLOBS)))
    for _ in range(data.draw(st.integers(1, 4))):
        blob[data.draw(st.integers(0, len(blob) - 1))] = data.draw(st.integers(0, 255))
    _valid_or_refused(bytes(blob[: data.draw(st.integers(0, len(blob)))]))


layer_arrays = st.builds(
    lambda shape, dtype, fill: np.full(shape, fill if np.dtype(dtype).kind == "f" else 1, dtype),
    st.lists(st.integers(0, 3), max_size=3).map(tuple),
    st.sampled_from([np.float32, np.float64, np.int32, np.uint8, np.float16]),
    st.sampled_from([0.5, 0.0, np.inf, np.nan]),
)


@FAST
@given(st.dictionaries(
    st.sampled_from(["layers.0.weight", "layers.0.bias", "layers.1.weight", "layers.1.bias", "x"]),
    layer_arrays, max_size=5,
))  # fmt: skip
def test_wrongly_shaped_weights_load_or_are_refused(tensors):
    _valid_or_refused(encode_weights(tensors))


# --- task arguments, as a worker decodes them from a JSON Celery message ---

REQUESTS = {
    ChunkRequest: ChunkRequest(
        "run-f", 1, "CartPole-v1", 2, 8, seed=1, behaviour=EpsilonGreedy(0.1)
    ),
    EvalRequest: EvalRequest("run-f", 0, 0, 3, "CartPole-v1", [1, 2]),
    ShardSpec: ShardSpec("sess", 0, "CartPole-v1", [0, 1], 5.0, 60.0),
}
# Python's json (and so Celery's JSON) writes and reads NaN and Infinity.
arg_values = json_values | st.sampled_from([float("nan"), float("inf"), float("-inf")])


# A behaviour value as a worker may receive it: its kind right, wrong or missing, its fields
# anything JSON carries.
behaviour_values = st.fixed_dictionaries(
    {},
    optional={
        "kind": st.sampled_from(["epsilon_greedy", "categorical", "gaussian"]) | arg_values,
        "epsilon": arg_values | st.floats(-0.5, 1.5),
        "extra": arg_values,
    },
)


def _numbers(tree) -> list[float]:
    """Every float in a JSON tree (a nested behaviour's included)."""
    if isinstance(tree, dict):
        return [x for v in tree.values() for x in _numbers(v)]
    if isinstance(tree, list):
        return [x for v in tree for x in _numbers(v)]
    return [tree] if isinstance(tree, float) else []


@FAST
@given(st.sampled_from(list(REQUESTS)), st.data())
def test_task_arguments_decode_or_raise_task_args_error(kind, data):
    good = REQUESTS[kind].to_json()
    field_names = [*good, "extra"]
    args = data.draw(st.one_of(
        arg_values,
        st.fixed_dictionaries({}, optional={k: arg_values for k in field_names}),
        st.sampled_from(field_names).flatmap(lambda k: arg_values.map(lambda v: {**good, k: v})),
        behaviour_values.map(lambda b: {**good, "behaviour": b}),
    ))  # fmt: skip
    args = json.loads(json.dumps(args))  # exactly what a JSON Celery message carries
    try:
        req = kind.from_json(args)
    except TaskArgsError as exc:
        assert str(exc)
        return
    # What is accepted is finite where a number is used as one, and survives the trip again.
    assert all(math.isfinite(v) for v in _numbers(req.to_json())), req
    assert kind.from_json(json.loads(json.dumps(req.to_json()))) == req
    if kind is ChunkRequest:
        assert req.behaviour.kind in ("epsilon_greedy", "categorical")
        assert 0.0 <= getattr(req.behaviour, "epsilon", 0.0) <= 1.0
