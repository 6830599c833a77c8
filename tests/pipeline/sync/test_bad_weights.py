"""Damaged weight blobs and probes, read by a worker's real weight client from a real server (and by
real workers): each is refused, counted under a named reason, and never ends the worker."""

from __future__ import annotations

import json
import time
import uuid

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from clusterenv.pipeline.behaviour import EpsilonGreedy
from clusterenv.pipeline.chunks.request import COLLECT_CHUNK_TASK, ChunkRequest
from clusterenv.pipeline.codec import ArraySpec, encode_weights
from clusterenv.pipeline.connect import connect
from clusterenv.pipeline.evaluation.request import EvalRequest
from clusterenv.pipeline.evaluation.runner import EvalRunner
from clusterenv.pipeline.keys import RunKeys
from clusterenv.pipeline.policy import NumpyConvNet, NumpyMLP
from clusterenv.pipeline.sync.client import RedisWeightClient, WeightsRejected
from clusterenv.pipeline.sync.rules import parse_sync
from clusterenv.pipeline.sync.source import RedisWeightSource
from tests.fakes import CARTPOLE, REF, conv_weights, net

FEW = settings(max_examples=20, deadline=None, suppress_health_check=list(HealthCheck))


def _without(d: dict, key: str) -> dict:
    return {k: v for k, v in d.items() if k != key}


def _set(d: dict, key: str, value: np.ndarray) -> dict:
    return {**d, key: value}


# A fine policy on its own, refused against the env's 4-value observations (and a held 4-input one).
SIX_INPUTS = encode_weights(_set(net(0), "layers.0.weight", np.ones((16, 6), np.float32)))
# Blobs no worker may act with: not safetensors at all, or safetensors that make no fitting policy.
bad_blobs = st.one_of(
    st.binary(max_size=200),
    st.builds(lambda b, n: b[:n], st.just(encode_weights(net(0))), st.integers(0, 200)),
    st.sampled_from([
        _without(net(0), "layers.1.bias"),
        _without(net(0), "layers.0.weight"),
        _set(net(0), "layers.0.bias", np.zeros(3, np.float32)),  # 3 biases for 16 outputs
        _set(net(0), "layers.1.weight", np.zeros((2, 5), np.float32)),  # takes 5 of 16
        _set(net(0), "layers.0.weight", np.full((16, 4), np.nan, np.float32)),
        _set(net(0), "layers.0.weight", np.ones((16, 4), np.int32)),
        _set(net(0), "layers.1.weight", np.ones(16, np.float32)),
    ]).map(encode_weights),
    st.just(SIX_INPUTS),
)  # fmt: skip


def corrupt_version(client, keys: RunKeys, version: int, blob: bytes) -> None:
    client.set(keys.weights(version), blob, ex=60)
    client.set(keys.weights_latest, version)


@FEW
@given(blob=bad_blobs)
def test_a_bad_blob_is_counted_and_the_held_policy_kept(redis_url, blob):
    client, keys = connect(redis_url), RunKeys(f"bad-{uuid.uuid4().hex[:10]}")
    RedisWeightSource(client, keys).publish(net(0))
    wc = RedisWeightClient(client, keys, parse_sync("on-change"), CARTPOLE.obs)
    held = wc.sync(EpsilonGreedy(0.1))
    corrupt_version(client, keys, 1, blob)
    assert wc.sync(EpsilonGreedy(0.1)) is held and wc.version == 0
    assert wc.sync(EpsilonGreedy(0.1)) is held  # asked again next chunk, refused again
    assert wc.counters.weights_rejected == 2
    ((reason, count),) = wc.rejected_reasons.items()
    assert reason.startswith("weights version 1: ") and count == 2
    client.delete(keys.weights(0), keys.weights(1), keys.weights_latest)


@FEW
@given(blob=bad_blobs)
def test_a_bad_first_blob_is_a_named_error(redis_url, blob):
    client, keys = connect(redis_url), RunKeys(f"bad-{uuid.uuid4().hex[:10]}")
    corrupt_version(client, keys, 0, blob)
    wc = RedisWeightClient(client, keys, parse_sync("on-change"), CARTPOLE.obs)
    with pytest.raises(WeightsRejected, match="weights version 0: "):
        wc.sync(EpsilonGreedy(0.1))
    assert wc.counters.weights_rejected == 1 and wc.policy is None
    client.delete(keys.weights(0), keys.weights_latest)


def test_a_conv_net_must_take_the_observations_shape_not_only_their_size(client, run_id):
    keys = RunKeys(run_id)
    planes = ArraySpec("|u1", (6, 10, 10))  # MinAtar-like observations, channel-first
    RedisWeightSource(client, keys).publish(conv_weights((6, 10, 10)))
    wc = RedisWeightClient(client, keys, parse_sync("on-change"), planes)
    held = wc.sync(EpsilonGreedy(0.1))
    assert isinstance(held, NumpyConvNet)
    # Fine networks of 600 inputs each: a conv net for channel-last planes, and an MLP (which
    # would take the planes flattened, but is not the kind of network held).
    mlp = {
        "layers.0.weight": np.ones((3, 600), np.float32),
        "layers.0.bias": np.zeros(3, np.float32),
    }
    for version, weights in ((1, conv_weights((10, 10, 6))), (2, mlp)):
        corrupt_version(client, keys, version, encode_weights(weights))
        assert wc.sync(EpsilonGreedy(0.1)) is held and wc.version == 0
    assert list(wc.rejected_reasons) == [
        "weights version 1: input (10, 10, 6) for observations of shape (6, 10, 10)",
        "weights version 2: inputs or outputs differ from the version held",
    ]
    corrupt_version(client, keys, 3, encode_weights(conv_weights((6, 10, 10), seed=3)))
    assert wc.sync(EpsilonGreedy(0.1)) is not held and wc.version == 3
    first = RedisWeightClient(client, keys, parse_sync("on-change"), CARTPOLE.obs)
    with pytest.raises(
        WeightsRejected, match=r"input \(6, 10, 10\) for observations of shape \(4,\)"
    ):
        first.sync(EpsilonGreedy(0.1))


probe_fields = st.dictionaries(
    st.sampled_from([b"header", b"a:q", b"a:obs", b"x"]),
    st.binary(max_size=40) | st.sampled_from([b'{"v":1,"ref":0,"arrays":{}}', b"{}"]),
    min_size=1, max_size=4,
)  # fmt: skip


@FEW
@given(fields=probe_fields, target=st.sampled_from(["probe", "reference"]))
def test_a_bad_probe_or_reference_is_counted_and_the_weights_fetched(redis_url, fields, target):
    client, keys = connect(redis_url), RunKeys(f"bad-{uuid.uuid4().hex[:10]}")
    source = RedisWeightSource(client, keys)
    source.publish_reference(REF)
    source.publish(net(0), NumpyMLP(net(0))(REF))
    wc = RedisWeightClient(
        client, keys, parse_sync("aps:1000"), CARTPOLE.obs
    )  # never fetches on divergence
    wc.sync(EpsilonGreedy(0.1))
    source.publish(net(1), NumpyMLP(net(1))(REF))
    key = keys.probe(1) if target == "probe" else keys.reference(0)
    client.delete(key)
    client.hset(key, mapping=fields)
    wc.sync(EpsilonGreedy(0.1))
    # Without a usable probe APS cannot measure divergence, so it fetches, as other rules would.
    assert wc.version == 1 and wc.counters.probes_rejected == 1
    assert len(wc.rejected_reasons) == 1
    client.delete(keys.probe(0), keys.probe(1), keys.reference(0), keys.weights(0),
                  keys.weights(1), keys.weights_latest)  # fmt: skip


def test_a_non_finite_probe_is_refused(client, run_id):
    keys = RunKeys(run_id)
    source = RedisWeightSource(client, keys)
    source.publish_reference(REF)
    source.publish(net(0), NumpyMLP(net(0))(REF))
    wc = RedisWeightClient(client, keys, parse_sync("aps:1000"), CARTPOLE.obs)
    wc.sync(EpsilonGreedy(0.1))
    q = NumpyMLP(net(1))(REF)
    q[3, 1] = np.nan  # NaN would compare below any tolerance: the worker would never fetch
    source.publish(net(1), q)
    wc.sync(EpsilonGreedy(0.1))
    assert wc.version == 1 and wc.counters.probes_rejected == 1
    assert list(wc.rejected_reasons) == [f"{keys.probe(1)}: non-finite values"]


def test_workers_refuse_a_bad_blob_and_serve_on(workers, celery_app, client, run_id):
    keys = RunKeys(run_id)
    corrupt_version(client, keys, 0, b"\x10\x00\x00\x00\x00\x00\x00\x00{not safetensors}")
    good = RunKeys(f"{run_id}-good")
    RedisWeightSource(client, good).publish(net(0))
    for rid in (keys.run_id, good.run_id):
        req = ChunkRequest(rid, 0, "CartPole-v1", 2, 5, seed=1, behaviour=EpsilonGreedy(0.5))
        celery_app.send_task(COLLECT_CHUNK_TASK, kwargs=req.to_json())
    deadline = time.monotonic() + 30
    while client.xlen(good.stream) == 0:
        assert time.monotonic() < deadline, "the workers stopped serving after a bad blob"
        time.sleep(0.1)
    log = workers.log_path.read_text()
    while "WeightsRejected" not in log:
        assert time.monotonic() < deadline, "no worker logged the refused blob"
        time.sleep(0.1)
        log = workers.log_path.read_text()
    assert "weights version 0: weights blob is not valid safetensors" in log
    assert client.xlen(keys.stream) == 0
    assert all(p.poll() is None for p in workers.procs)


def test_an_evaluation_of_a_bad_blob_reports_why(client, run_id):
    keys = RunKeys(run_id)
    corrupt_version(client, keys, 2, encode_weights(_without(net(0), "layers.1.bias")))
    result = EvalRunner(client, "w").run(EvalRequest(run_id, 0, 0, 2, "CartPole-v1", [1, 2]))
    assert result["error"] == "weights version 2 rejected: layers.1.bias is missing"
    assert json.loads(client.lpop(keys.eval_results)) == result  # the learner hears it
