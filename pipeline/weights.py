"""Versioned policy weights in Redis: the learner's source publishes, each worker's client fetches.

`…:weights:{v}` holds safetensors bytes with a TTL, `…:weights:latest` the newest version.
The client reads `latest` once per chunk and fetches full weights only when its sync rule says so.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass

import numpy as np
import redis

from pipeline.codec import decode_weights, encode_weights
from pipeline.keys import RunKeys
from pipeline.policy import NumpyMLP
from pipeline.sync import SyncRule


class WeightSource:
    """Learner side: publish a new version; old versions expire or are deleted past `keep`."""

    def __init__(self, client: redis.Redis, keys: RunKeys, ttl_s: int = 300, keep: int = 32):
        self.client, self.keys, self.ttl_s, self.keep = client, keys, ttl_s, keep
        self.version = -1
        self.bytes_published = 0

    def publish(self, tensors: Mapping[str, np.ndarray]) -> int:
        self.version += 1
        blob = encode_weights(tensors, metadata={"version": str(self.version)})
        pipe = self.client.pipeline(transaction=True)
        pipe.set(self.keys.weights(self.version), blob, ex=self.ttl_s)
        pipe.set(self.keys.weights_latest, self.version)
        if self.version - self.keep >= 0:
            pipe.delete(self.keys.weights(self.version - self.keep))
        pipe.execute()
        self.bytes_published += len(blob)
        return self.version


@dataclass
class SyncCounters:
    """What a worker's client has done, cumulative; travels in every chunk header."""

    version_checks: int = 0
    weight_fetches: int = 0
    weight_bytes: int = 0


class WeightClient:
    """Worker side: holds one policy version and decides, per chunk, whether to fetch a newer one."""

    def __init__(self, client: redis.Redis, keys: RunKeys, rule: SyncRule):
        self.client, self.keys, self.rule = client, keys, rule
        self.version: int | None = None
        self.policy: NumpyMLP | None = None
        self.steps_since_fetch = 0
        self.counters = SyncCounters()

    def sync(self) -> NumpyMLP:
        """Run the sync check; returns the policy to act with for the next chunk."""
        raw = self.client.get(self.keys.weights_latest)
        self.counters.version_checks += 1
        if raw is None:
            raise RuntimeError(f"run {self.keys.run_id!r} has published no weights")
        latest = int(raw)
        if self.policy is None or self.rule.should_fetch(self, latest):
            self._fetch(latest)
        assert self.policy is not None
        return self.policy

    def record_steps(self, env_steps: int) -> None:
        self.steps_since_fetch += env_steps

    def _fetch(self, version: int) -> None:
        blob = self.client.get(self.keys.weights(version))
        if blob is None:  # expired between the two reads: take whatever is newest now
            version = int(self.client.get(self.keys.weights_latest))
            blob = self.client.get(self.keys.weights(version))
            if blob is None:
                raise RuntimeError(f"weights version {version} of run {self.keys.run_id!r} vanished")
        self.policy = NumpyMLP(decode_weights(blob))
        self.version = version
        self.steps_since_fetch = 0
        self.counters.weight_fetches += 1
        self.counters.weight_bytes += len(blob)

    def counters_json(self) -> dict[str, int]:
        return asdict(self.counters)
