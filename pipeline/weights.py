"""Versioned policy weights in Redis: the learner's source publishes, each worker's client fetches.

`…:weights:{v}` holds safetensors bytes, `…:weights:latest` the newest version. With each version
the source can publish a probe (`…:probe:{v}`: the learner's Q-values on a versioned batch of
reference states, `…:reference:{r}`), so a client can measure how far its own policy has
drifted for a few KB instead of fetching the full weights.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass

import numpy as np
import redis

from pipeline.codec import (
    ArraySpec,
    CodecError,
    decode_chunk,
    decode_weights,
    encode_chunk,
    encode_weights,
)
from pipeline.divergence import DIVERGENCES
from pipeline.keys import RunKeys
from pipeline.policy import NumpyMLP
from pipeline.sync import SyncRule


def _size(fields: Mapping[bytes, bytes]) -> int:
    return sum(len(k) + len(v) for k, v in fields.items())


class WeightSource:
    """Learner side: publish versions (and probes); versions older than `keep` are deleted."""

    def __init__(self, client: redis.Redis, keys: RunKeys, ttl_s: int = 600, keep: int = 64):
        self.client, self.keys, self.ttl_s, self.keep = client, keys, ttl_s, keep
        self.version = -1
        self.reference_version = -1
        self.reference: np.ndarray | None = None

    def publish_reference(self, states: np.ndarray) -> int:
        """Store a new batch of reference states; later probes are computed on it."""
        self.reference_version += 1
        fields = encode_chunk({"ref": self.reference_version}, {"obs": states})
        key = self.keys.reference(self.reference_version)
        pipe = self.client.pipeline(transaction=True)
        pipe.hset(key, mapping=fields)
        pipe.expire(key, self.ttl_s)
        pipe.execute()
        self.reference = np.array(states)
        return self.reference_version

    def publish(self, tensors: Mapping[str, np.ndarray], probe_q: np.ndarray | None = None) -> int:
        """New version from named arrays; `probe_q`: the same weights' Q-values on `reference`."""
        self.version += 1
        blob = encode_weights(tensors, metadata={"version": str(self.version)})
        pipe = self.client.pipeline(transaction=True)
        pipe.set(self.keys.weights(self.version), blob, ex=self.ttl_s)
        if probe_q is not None:
            probe = encode_chunk(
                {"version": self.version, "ref": self.reference_version}, {"q": probe_q}
            )
            pipe.hset(self.keys.probe(self.version), mapping=probe)
            pipe.expire(self.keys.probe(self.version), self.ttl_s)
        pipe.set(self.keys.weights_latest, self.version)
        old = self.version - self.keep
        if old >= 0:
            pipe.delete(self.keys.weights(old), self.keys.probe(old))
        pipe.execute()
        return self.version


@dataclass
class SyncCounters:
    """What a worker's client has done, cumulative; travels in every chunk header."""

    version_checks: int = 0
    weight_fetches: int = 0
    weight_bytes: int = 0
    probe_fetches: int = 0
    probe_bytes: int = 0


class WeightClient:
    """Worker side: holds one policy version and decides, per chunk, whether to fetch a newer one."""

    def __init__(self, client: redis.Redis, keys: RunKeys, rule: SyncRule):
        self.client, self.keys, self.rule = client, keys, rule
        self.version: int | None = None
        self.policy: NumpyMLP | None = None
        self.steps_since_fetch = 0
        self.own_version_stored = True
        self.last_divergence: float | None = None
        self.counters = SyncCounters()
        self._fetched_at = time.monotonic()
        self._reference: tuple[int, np.ndarray] | None = None

    def sync(self, epsilon: float) -> NumpyMLP:
        """The per-chunk sync check; returns the policy to act with for the next chunk."""
        pipe = self.client.pipeline(transaction=False)
        pipe.get(self.keys.weights_latest)
        if self.version is not None:
            pipe.exists(self.keys.weights(self.version))
        replies = pipe.execute()
        self.counters.version_checks += 1
        self.last_divergence = None
        if replies[0] is None:
            raise RuntimeError(f"run {self.keys.run_id!r} has published no weights")
        latest = int(replies[0])
        self.own_version_stored = bool(replies[1]) if len(replies) > 1 else False
        if self.policy is None or self.rule.should_fetch(self, latest, epsilon):
            self._fetch(latest)
        assert self.policy is not None
        return self.policy

    def record_steps(self, env_steps: int) -> None:
        self.steps_since_fetch += env_steps

    def seconds_since_fetch(self) -> float:
        return time.monotonic() - self._fetched_at

    def divergence_to(self, version: int, epsilon: float, measure: str) -> float | None:
        """D between the held policy and `version`, from that version's probe; None if no probe."""
        probe = self._read(
            self.keys.probe(version), {"q": ArraySpec("<f4", (self.policy.num_outputs,))}
        )
        if probe is None:
            return None
        header, arrays = probe
        states = self._reference_states(header.get("ref"))
        if states is None or len(states) != len(arrays["q"]):
            return None
        d = DIVERGENCES[measure](arrays["q"], self.policy(states), epsilon)
        self.last_divergence = d
        return d

    def _reference_states(self, ref: object) -> np.ndarray | None:
        if not isinstance(ref, int):
            return None
        if self._reference is not None and self._reference[0] == ref:
            return self._reference[1]
        obs_dim = self.policy.layers[0][0].shape[0]
        got = self._read(self.keys.reference(ref), {"obs": ArraySpec("<f4", (obs_dim,))})
        if got is None:
            return None
        self._reference = (ref, got[1]["obs"].copy())
        return self._reference[1]

    def _read(self, key: str, expected: dict[str, ArraySpec]):
        fields = self.client.hgetall(key)
        if not fields:
            return None
        self.counters.probe_fetches += 1
        self.counters.probe_bytes += _size(fields)
        try:
            return decode_chunk(fields, expected)
        except CodecError:
            return None

    def _fetch(self, version: int) -> None:
        blob = self.client.get(self.keys.weights(version))
        if blob is None:  # expired between the two reads: take whatever is newest now
            version = int(self.client.get(self.keys.weights_latest))
            blob = self.client.get(self.keys.weights(version))
            if blob is None:
                raise RuntimeError(
                    f"weights version {version} of run {self.keys.run_id!r} vanished"
                )
        self.policy = NumpyMLP(decode_weights(blob))
        self.version = version
        self.steps_since_fetch = 0
        self._fetched_at = time.monotonic()
        self.counters.weight_fetches += 1
        self.counters.weight_bytes += len(blob)

    def counters_json(self) -> dict[str, int]:
        return asdict(self.counters)
