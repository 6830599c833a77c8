"""Sync rules and their accounting against a real server: what is fetched, when, and how many bytes."""

from __future__ import annotations

import numpy as np
import pytest

from clusterenv.pipeline.behaviour import Categorical, EpsilonGreedy
from clusterenv.pipeline.codec import ArraySpec, decode_chunk, decode_header
from clusterenv.pipeline.keys import RunKeys
from clusterenv.pipeline.policy import NumpyMLP
from clusterenv.pipeline.sync.client import RedisWeightClient
from clusterenv.pipeline.sync.rules import Aps, parse_sync
from clusterenv.pipeline.sync.source import RedisWeightSource
from tests.fakes import CARTPOLE, REF, net


class Learner:
    """Publishes versions with probes, as clusterenv.learner.run.loop does."""

    def __init__(self, client, run_id: str, keep: int = 64):
        self.source = RedisWeightSource(client, RunKeys(run_id), keep=keep)
        self.source.publish_reference(REF)
        self.blobs: dict[int, int] = {}

    def publish(self, weights) -> int:
        v = self.source.publish(weights, NumpyMLP(weights)(REF))
        self.blobs[v] = self.source.client.strlen(self.source.keys.weights(v))
        return v


def client_for(client, run_id, spec):
    return RedisWeightClient(
        client, RunKeys(run_id), parse_sync(spec) if isinstance(spec, str) else spec, CARTPOLE.obs
    )


def test_on_change_fetches_each_seen_version_once(client, run_id):
    learner, wc = Learner(client, run_id), client_for(client, run_id, "on-change")
    fetched = []
    for v in range(5):
        learner.publish(net(v))
        for _ in range(3):  # several chunks per version: only the first one fetches
            wc.sync(EpsilonGreedy(0.1))
            if not fetched or fetched[-1] != wc.version:
                fetched.append(wc.version)
    assert fetched == [0, 1, 2, 3, 4]
    assert wc.counters.weight_fetches == 5 and wc.counters.version_checks == 15
    assert wc.counters.weight_bytes == sum(learner.blobs.values())


def test_always_fetches_every_chunk(client, run_id):
    learner, wc = Learner(client, run_id), client_for(client, run_id, "always")
    learner.publish(net(0))
    for _ in range(4):
        wc.sync(EpsilonGreedy(0.1))
    assert wc.counters.weight_fetches == 4
    assert wc.counters.weight_bytes == 4 * learner.blobs[0]


def test_interval_respects_n(client, run_id):
    learner, wc = Learner(client, run_id), client_for(client, run_id, "interval:1000")
    learner.publish(net(0))
    wc.sync(EpsilonGreedy(0.1))
    for step in range(1, 6):
        learner.publish(net(step))
        wc.record_steps(256)
        wc.sync(EpsilonGreedy(0.1))
        expected_version = 0 if 256 * step < 1000 else 4
        assert wc.version == expected_version, step
    assert wc.counters.weight_fetches == 2  # the first, then once 1024 >= 1000 steps had passed


def test_aps_skips_identical_weights_and_fetches_a_changed_policy(client, run_id):
    learner, wc = Learner(client, run_id), client_for(client, run_id, "aps:0.01")
    learner.publish(net(0))
    wc.sync(EpsilonGreedy(0.0))
    learner.publish(net(0))  # a new version with the same weights
    wc.sync(EpsilonGreedy(0.0))
    assert wc.version == 0 and wc.last_divergence == 0.0
    learner.publish(net(7))
    wc.sync(EpsilonGreedy(0.0))
    assert wc.version == 2 and wc.last_divergence > 0.01
    assert wc.counters.weight_fetches == 2


def stale_client(client, run_id: str, spec: str) -> RedisWeightClient:
    """A worker's client that fetched v0 = net(0); the learner has since published v1 = net(3)."""
    learner = Learner(client, run_id)
    learner.publish(net(0))
    wc = client_for(client, run_id, spec)
    wc.sync(EpsilonGreedy(0.0))  # a client's first sync always fetches
    learner.publish(net(3))
    assert wc.version == 0
    return wc


def test_aps_tolerance_decides(client, run_id):
    measured = stale_client(client, f"{run_id}-measured", "aps:0")
    d = measured.divergence_to(1, EpsilonGreedy(0.0), "value")
    assert d is not None and d > 0
    for i, (tol, fetch) in enumerate([(d * 0.5, True), (d * 2, False)]):
        wc = stale_client(client, f"{run_id}-{i}", f"aps:{tol}")  # same weights, same probes
        wc.sync(EpsilonGreedy(0.0))
        assert (wc.version == 1) is fetch, tol


def test_an_evicted_version_forces_a_fetch(client, run_id):
    learner, wc = Learner(client, run_id), client_for(client, run_id, "aps:0.5")
    learner.publish(net(0))
    wc.sync(EpsilonGreedy(0.0))
    learner.publish(net(0))
    wc.sync(EpsilonGreedy(0.0))
    assert wc.version == 0
    client.delete(RunKeys(run_id).weights(0))  # retention dropped the worker's version
    wc.sync(EpsilonGreedy(0.0))
    assert wc.version == 1


def test_retention_deletes_old_versions(client, run_id):
    learner = Learner(client, run_id, keep=2)
    for _ in range(4):
        learner.publish(net(0))
    keys = RunKeys(run_id)
    assert [bool(client.exists(keys.weights(v))) for v in range(4)] == [False, False, True, True]


def test_a_reference_batch_goes_once_no_kept_version_or_next_probe_reads_it(client, run_id):
    learner, keys = Learner(client, run_id, keep=2), RunKeys(run_id)

    def references() -> list[bool]:
        return [bool(client.exists(keys.reference(r))) for r in range(4)]

    learner.publish(net(0))  # v0 on batch 0
    learner.source.publish_reference(REF)  # batch 1; v0 still reads batch 0
    learner.publish(net(0))  # v1 on batch 1
    assert references() == [True, True, False, False]
    learner.publish(net(0))  # v2 on batch 1; v0 deleted, and batch 0 with it
    assert references() == [False, True, False, False]
    learner.source.publish_reference(REF)  # batch 2: v1 and v2 still read batch 1
    learner.source.publish_reference(REF)  # batch 3: batch 2 was never read by a probe
    assert references() == [False, True, False, True]
    learner.publish(net(0))
    learner.publish(net(0))  # v3 and v4 on batch 3: v1 and v2 deleted, batch 1 with them
    assert references() == [False, False, False, True]
    # Every kept version's probe can still be checked against its batch.
    for v in (3, 4):
        header = decode_header(client.hgetall(keys.probe(v)))
        assert client.exists(keys.reference(header["ref"]))


def test_max_lag_guard_fires(client, run_id):
    learner = Learner(client, run_id)
    wc = client_for(client, run_id, Aps(tolerance=1.0, max_lag_versions=3))
    learner.publish(net(0))
    wc.sync(EpsilonGreedy(0.0))
    versions = []
    for _ in range(6):
        learner.publish(net(0))  # identical weights: divergence alone would never fetch
        wc.sync(EpsilonGreedy(0.0))
        versions.append(wc.version)
    assert versions == [0, 0, 3, 3, 3, 6]


def test_byte_counters_equal_what_the_server_sent(client, run_id):
    learner = Learner(client, run_id)
    learner.publish(net(0))
    wc = client_for(client, run_id, "aps:0")
    out0 = int(client.info("stats")["total_net_output_bytes"])
    wc.sync(EpsilonGreedy(0.0))  # first fetch: weights only
    assert wc.version == 0
    learner.publish(net(5))
    learner.publish(net(9))  # the worker, holding v0, is now two versions behind
    wc.sync(EpsilonGreedy(0.0))  # probe + reference + weights
    out1 = int(client.info("stats")["total_net_output_bytes"])
    assert wc.version == 2
    counted = wc.counters.weight_bytes + wc.counters.probe_bytes
    assert wc.counters.weight_bytes == learner.blobs[0] + learner.blobs[2]
    assert wc.counters.probe_fetches == 2  # the probe and the reference batch
    probe_key, ref_key = RunKeys(run_id).probe(2), RunKeys(run_id).reference(0)
    stored = sum(
        len(k) + len(v) for key in (probe_key, ref_key) for k, v in client.hgetall(key).items()
    )
    assert wc.counters.probe_bytes == stored
    # The server sent the counted payload plus RESP framing and small replies (INFO excluded).
    assert counted <= out1 - out0 <= counted + 4096


@pytest.mark.parametrize("spec", ["aps:-1", "aps:x", "aps:0.1:js", "interval:0", "sometimes"])
def test_bad_specs_are_refused(spec):
    with pytest.raises(ValueError, match=repr(spec).strip("'") if spec != "aps:0.1:js" else "js"):
        parse_sync(spec)


def test_the_sync_check_sees_a_stopped_run_in_the_same_round_trip(client, run_id):
    learner, wc = Learner(client, run_id), client_for(client, run_id, "on-change")
    learner.publish(net(0))
    assert wc.sync(EpsilonGreedy(0.1)) is not None and not wc.run_stopped
    client.set(RunKeys(run_id).stop, 1)
    learner.publish(net(1))
    assert wc.sync(EpsilonGreedy(0.1)) is None and wc.run_stopped
    assert wc.version == 0 and wc.counters.weight_fetches == 1  # nothing fetched once stopped


def test_categorical_aps_measures_the_policies_kl_on_the_probe(client, run_id):
    """PPO's workers: `aps:TOL` is the mean KL(π_learner ‖ π_worker) of the softmax policies of
    the probe's logits and the held network's, on the same reference states."""
    from clusterenv.pipeline.sync.divergence import categorical_kl

    learner = Learner(client, run_id)
    learner.publish(net(0))
    rule = parse_sync("aps:0.01", kind=Categorical)
    assert rule == Aps(0.01, "kl")
    wc = RedisWeightClient(client, RunKeys(run_id), rule, CARTPOLE.obs)
    wc.sync(Categorical())
    learner.publish(net(0))  # the same weights as a new version: nothing to fetch
    assert wc.divergence_to(1, Categorical(), "kl") == 0.0
    wc.sync(Categorical())
    assert wc.version == 0 and wc.last_divergence == 0.0
    learner.publish(net(3))
    expected = categorical_kl(NumpyMLP(net(3))(REF), NumpyMLP(net(0))(REF))
    assert wc.divergence_to(2, Categorical(), "kl") == pytest.approx(expected) and expected > 0.01
    wc.sync(Categorical())
    assert wc.version == 2  # past the tolerance: fetched


def test_aps_reads_a_versions_probe_once_while_it_stays_behind_it(client, run_id):
    """PPO publishes a version per update, several chunks apart: a worker under the tolerance
    re-measures only when a newer version (or its own fetch) changes the question."""
    learner = Learner(client, run_id)
    learner.publish(net(0))
    wc = RedisWeightClient(client, RunKeys(run_id), Aps(1e9, "kl"), CARTPOLE.obs)
    wc.sync(Categorical())
    learner.publish(net(3))
    for _ in range(4):
        wc.sync(Categorical())
        assert wc.version == 0 and wc.last_divergence > 0
    assert wc.counters.probe_fetches == 2  # version 1's probe and the reference batch, once
    learner.publish(net(4))
    wc.sync(Categorical())
    assert wc.counters.probe_fetches == 3  # a newer version: its probe (same reference states)
    assert wc.counters.probe_bytes == sum(
        len(k) + len(v)
        for key in (
            RunKeys(run_id).probe(1),
            RunKeys(run_id).probe(2),
            RunKeys(run_id).reference(0),
        )
        for k, v in client.hgetall(key).items()
    )


def test_uint8_reference_states_reach_the_worker_as_observed(client, run_id):
    """The learner's publisher stores reference states from its pool in the observation's own dtype
    and shape (a uint8 frame stays a uint8 frame), and an APS worker reads them so: its divergence
    is the one measured on exactly those states."""
    from clusterenv.learner.config import WeightSyncConfig
    from clusterenv.learner.run.publisher import Publisher, ReferencePool

    shape, rng = (10, 10, 4), np.random.default_rng(0)
    frames = rng.integers(0, 256, (80, *shape), dtype=np.uint8)
    pool = ReferencePool(100)
    pool.add({"obs": frames, "action": np.zeros(len(frames), np.int64)})
    keys = RunKeys(run_id)
    source = RedisWeightSource(client, keys)
    publisher = Publisher(source, pool, WeightSyncConfig(reference_size=8), rng)

    def weights(seed: int) -> dict[str, np.ndarray]:
        w = np.random.default_rng(seed).normal(size=(3, 400)).astype(np.float32) / 400
        return {"layers.0.weight": w, "layers.0.bias": np.zeros(3, np.float32)}

    publisher.publish(weights(0), updates=0)
    assert source.reference.dtype == np.uint8 and source.reference.shape == (8, *shape)
    obs = ArraySpec("|u1", shape)
    _, stored = decode_chunk(client.hgetall(keys.reference(0)), {"obs": obs})
    np.testing.assert_array_equal(stored["obs"], source.reference)

    wc = RedisWeightClient(client, keys, Aps(1e9, "value"), obs)
    wc.sync(EpsilonGreedy(0.0))
    publisher.publish(weights(1), updates=1)
    wc.sync(EpsilonGreedy(0.0))
    learner, worker = NumpyMLP(weights(1))(source.reference), NumpyMLP(weights(0))(source.reference)
    assert wc.counters.probes_rejected == 0 and wc.version == 0
    assert wc.last_divergence == EpsilonGreedy(0.0).divergence("value", learner, worker) > 0


def test_float16_weights_are_what_the_worker_acts_with_and_probes_measure(client, run_id):
    """--weights-dtype float16: the published blob holds float16 arrays (about half the bytes of
    float32), and the probe is computed on them, so a worker holding a version of the same weights
    measures a divergence of exactly zero (a probe on the learner's float32 copy would not)."""
    from clusterenv.learner.config import WeightSyncConfig
    from clusterenv.learner.run.publisher import Publisher, ReferencePool
    from clusterenv.pipeline.codec import decode_weights, encode_weights

    rng = np.random.default_rng(0)
    pool = ReferencePool(100)
    pool.add({"obs": rng.normal(size=(80, 4)).astype(np.float32), "action": np.zeros(80, np.int64)})
    keys = RunKeys(run_id)
    source = RedisWeightSource(client, keys)
    cfg = WeightSyncConfig(reference_size=8, weights_dtype="float16")
    publisher = Publisher(source, pool, cfg, rng)
    big = np.random.default_rng(3)  # big enough that the header is a small part of the blob
    w = {"layers.0.weight": big.normal(size=(256, 4)).astype(np.float32),
         "layers.0.bias": np.zeros(256, np.float32),
         "layers.1.weight": big.normal(size=(2, 256)).astype(np.float32),
         "layers.1.bias": np.zeros(2, np.float32)}  # fmt: skip
    assert {a.dtype for a in w.values()} == {np.dtype(np.float32)}

    publisher.publish(w, updates=0)
    blob = client.get(keys.weights(0))
    assert {a.dtype for a in decode_weights(blob).values()} == {np.dtype(np.float16)}
    assert len(blob) < 0.6 * len(encode_weights(w))

    wc = RedisWeightClient(client, keys, Aps(0.0, "value"), CARTPOLE.obs)
    wc.sync(EpsilonGreedy(0.0))
    assert wc.version == 0
    publisher.publish(w, updates=1)  # the same weights again: nothing for the worker to fetch
    wc.sync(EpsilonGreedy(0.0))
    assert wc.last_divergence == 0.0 and wc.version == 0


def test_sacs_value_measure_travels_in_a_wider_probe_and_a_worker_measures_with_it(client, run_id):
    """`aps:TOL:value` on a SAC run: the publisher appends the critics' model of Q around the
    greedy action to each probe row (2d outputs + 1 + 2d), a worker's client reads that width and
    measures the change of Q its own actor's actions make, as the learner's critics see it."""
    from clusterenv.learner.config import WeightSyncConfig
    from clusterenv.learner.run.publisher import Publisher, ReferencePool
    from clusterenv.pipeline.behaviour import SquashedGaussian
    from tests.learner.test_sac_unit import learner as sac_learner

    sac, rng = sac_learner(), np.random.default_rng(0)
    for _ in range(10):
        sac.step()
    pool = ReferencePool(100)
    pool.add({"obs": rng.normal(size=(80, 3)).astype(np.float32), "action": np.zeros((80, 2))})
    keys = RunKeys(run_id)
    source = RedisWeightSource(client, keys)
    publisher = Publisher(source, pool, WeightSyncConfig(reference_size=16), rng,
                          value_probe=sac.value_model)  # fmt: skip
    behaviour, obs = SquashedGaussian(record=False), ArraySpec("<f4", (3,))
    wc = RedisWeightClient(client, keys, Aps(1e9, "value"), obs)
    publisher.publish(sac.get_weights(), updates=0)
    wc.sync(behaviour)
    held = sac.get_weights()
    for _ in range(10):
        sac.step()
    publisher.publish(sac.get_weights(), updates=10)
    wc.sync(behaviour)
    _, probe = decode_chunk(client.hgetall(keys.probe(1)), {"q": ArraySpec("<f4", (9,))})
    assert probe["q"].shape == (16, 4 + 1 + 4)
    worker = NumpyMLP(held)(source.reference)
    assert wc.counters.probes_rejected == 0 and wc.version == 0  # tolerance 1e9: no fetch
    assert wc.last_divergence == behaviour.divergence("value", probe["q"], worker) > 0
