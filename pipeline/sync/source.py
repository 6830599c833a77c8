"""Learner side of weight sync: publish numbered versions, their probes and the reference states.

`…:weights:{v}` holds safetensors bytes, `…:weights:latest` the newest version. With each version
the source can publish a probe (`…:probe:{v}`: the learner's outputs on a versioned batch of
reference states, `…:reference:{r}`), so a client can measure how far its own policy has drifted
for a few KB instead of fetching the full weights.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import redis

from clusterenv.pipeline.codec import encode_chunk, encode_weights
from clusterenv.pipeline.keys import RunKeys


def reference_pool_rows(size: int) -> int:
    """How many of the newest replay rows a batch of `size` reference states is drawn from (and
    so how many a learner without a replay buffer, PPO, keeps for it): ten per state, recent
    enough to be states the current policy visits, enough not to be a few episodes."""
    return 10 * size


class RedisWeightSource:
    """Publishes versions (and probes) with a TTL; versions more than `keep` behind are deleted,
    and so is a batch of reference states once neither a kept version's probe nor the next probe
    is computed on it. Without that, a fast learner kept every batch for the TTL (at ~7 versions
    a second, a refresh every 16: ~270 batches; bench/broker_memory.py)."""

    def __init__(self, client: redis.Redis, keys: RunKeys, ttl_s: int = 600, keep: int = 64):
        self.client, self.keys, self.ttl_s, self.keep = client, keys, ttl_s, keep
        self.version = -1
        self.reference_version = -1
        self.reference: np.ndarray | None = None
        self._probe_refs: dict[int, int] = {}  # kept version -> the batch its probe is computed on

    def _unused_reference(self, ref: int | None) -> list[str]:
        """The key of batch `ref` if nothing kept or to come reads it, to delete."""
        if ref is None or ref < 0 or ref == self.reference_version:
            return []
        return [] if ref in self._probe_refs.values() else [self.keys.reference(ref)]

    def publish_reference(self, states: np.ndarray) -> int:
        """Store a new batch of reference states; later probes are computed on it."""
        previous = self.reference_version
        self.reference_version += 1
        fields = encode_chunk({"ref": self.reference_version}, {"obs": states})
        key = self.keys.reference(self.reference_version)
        pipe = self.client.pipeline(transaction=True)
        pipe.hset(key, mapping=fields)
        pipe.expire(key, self.ttl_s)
        for unused in self._unused_reference(previous):
            pipe.delete(unused)
        pipe.execute()
        self.reference = np.array(states)
        return self.reference_version

    def publish(self, tensors: Mapping[str, np.ndarray], probe_q: np.ndarray | None = None) -> int:
        """New version from named arrays; `probe_q`: the same weights' outputs on `reference`."""
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
            self._probe_refs[self.version] = self.reference_version
        pipe.set(self.keys.weights_latest, self.version)
        old = self.version - self.keep
        if old >= 0:
            pipe.delete(self.keys.weights(old), self.keys.probe(old))
            for unused in self._unused_reference(self._probe_refs.pop(old, None)):
                pipe.delete(unused)
        pipe.execute()
        return self.version
