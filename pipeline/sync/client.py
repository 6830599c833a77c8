"""Worker side of weight sync: hold one policy version and run the per-chunk sync check.

Per chunk the client reads `latest`, whether its own version is still stored and whether the run
has stopped (one round trip, which also carries the previous chunk's XADD: pipeline/outbox.py);
its rule then decides whether to fetch the full weights. APS rules first read the newer version's
probe (and the reference states it was computed on, when they changed) to measure divergence,
once per pair of held and newest version.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass

import numpy as np
import redis
from redis.client import Pipeline

from clusterenv.pipeline.behaviour import Behaviour
from clusterenv.pipeline.codec import ArraySpec, CodecError, decode_chunk
from clusterenv.pipeline.keys import RunKeys
from clusterenv.pipeline.outbox import Outbox
from clusterenv.pipeline.policy import NumpyPolicy, load_policy
from clusterenv.pipeline.roles import SyncRule

log = logging.getLogger(__name__)


class WeightsRejected(ValueError):
    """The run's weights do not make a policy, and the worker holds none to act with instead."""


def _size(fields: Mapping[bytes, bytes]) -> int:
    return sum(len(k) + len(v) for k, v in fields.items())


def read_weights(client: redis.Redis, keys: RunKeys, version: int) -> tuple[int, bytes] | None:
    """The safetensors blob of `version`, or, if retention or the TTL dropped it meanwhile, of the
    newest version: (the version read, its blob). None when the run has no weights stored."""
    blob = client.get(keys.weights(version))
    if blob is not None:
        return version, blob
    latest = client.get(keys.weights_latest)
    if latest is None:
        return None
    blob = client.get(keys.weights(int(latest)))
    return (int(latest), blob) if blob is not None else None


@dataclass
class SyncCounters:
    """What a worker's client has done, cumulative; travels in every chunk header."""

    version_checks: int = 0
    weight_fetches: int = 0
    weight_bytes: int = 0
    probe_fetches: int = 0
    probe_bytes: int = 0
    # Blobs and probes refused (reasons in RedisWeightClient.rejected_reasons and the log).
    weights_rejected: int = 0
    probes_rejected: int = 0


class RedisWeightClient:
    """Holds one policy version and decides, per chunk, whether to fetch a newer one."""

    def __init__(
        self,
        client: redis.Redis,
        keys: RunKeys,
        rule: SyncRule,
        obs: ArraySpec,
        outbox: Outbox | None = None,
    ):
        self.client, self.keys, self.rule = client, keys, rule
        self.obs = obs  # one observation of the run's env: how its reference states are stored
        # The sync check's reads go out with whatever the outbox holds (the last chunk's XADD).
        self.outbox = outbox if outbox is not None else Outbox(client)
        self.version: int | None = None
        self.policy: NumpyPolicy | None = None
        self.steps_since_fetch = 0
        self.own_version_stored = True
        self.run_stopped = False
        self.last_divergence: float | None = None
        self.counters = SyncCounters()
        self.rejected_reasons: dict[str, int] = {}
        self._fetched_at = time.monotonic()
        self._reference: tuple[int, np.ndarray] | None = None
        # The last measurement, keyed by what it depends on: a worker that stays behind the same
        # newer version (PPO: most chunks between two updates) does not re-read its probe.
        self._measured: tuple[tuple[int | None, int, Behaviour, str], float] | None = None

    def sync(self, behaviour: Behaviour) -> NumpyPolicy | None:
        """The per-chunk sync check; returns the policy to act with for the next chunk, or None
        (and `run_stopped` set) when the run has ended."""

        def reads(pipe: Pipeline) -> None:
            pipe.exists(self.keys.stop)
            pipe.get(self.keys.weights_latest)
            if self.version is not None:
                pipe.exists(self.keys.weights(self.version))

        replies = self.outbox.send(reads)
        self.counters.version_checks += 1
        self.last_divergence = None
        self.run_stopped = bool(replies[0])
        if self.run_stopped:
            return None
        if replies[1] is None:
            raise RuntimeError(f"run {self.keys.run_id!r} has published no weights")
        latest = int(replies[1])
        self.own_version_stored = bool(replies[2]) if len(replies) > 2 else False
        if self.policy is None or self.rule.should_fetch(self, latest, behaviour):
            self._fetch(latest)
        assert self.policy is not None
        return self.policy

    def record_steps(self, env_steps: int) -> None:
        self.steps_since_fetch += env_steps

    def seconds_since_fetch(self) -> float:
        return time.monotonic() - self._fetched_at

    def divergence_to(self, version: int, behaviour: Behaviour, measure: str) -> float | None:
        """D between the held policy and `version`, from that version's probe; None if no usable
        probe (the rule then fetches, as it would without APS). A version's probe never changes,
        so the same question asked again is answered without reading it again."""
        key = (self.version, version, behaviour, measure)
        if self._measured is not None and self._measured[0] == key:
            self.last_divergence = self._measured[1]
            return self.last_divergence
        width = behaviour.probe_width(measure, self.policy.num_outputs)
        probe = self._read(self.keys.probe(version), {"q": ArraySpec("<f4", (width,))})
        if probe is None:
            return None
        header, arrays = probe
        ref = header.get("ref")
        if not isinstance(ref, int) or isinstance(ref, bool):
            return self._reject("probe", f"probe {version}: 'ref' {ref!r} is not an integer")
        states = self._reference_states(ref)
        if states is None:
            return None
        if len(states) != len(arrays["q"]):
            return self._reject(
                "probe", f"probe {version}: {len(arrays['q'])} rows for {len(states)} states"
            )
        d = behaviour.divergence(measure, arrays["q"], self.policy(states))
        self.last_divergence, self._measured = d, (key, d)
        return d

    def _reference_states(self, ref: int) -> np.ndarray | None:
        if self._reference is not None and self._reference[0] == ref:
            return self._reference[1]
        got = self._read(self.keys.reference(ref), {"obs": self.obs})
        if got is None:
            return None
        self._reference = (ref, got[1]["obs"].copy())
        return self._reference[1]

    def _read(self, key: str, expected: dict[str, ArraySpec]):
        """A probe or reference hash, decoded and checked; None (a counted rejection) if bad."""
        fields = self.client.hgetall(key)
        if not fields:
            return None
        self.counters.probe_fetches += 1
        self.counters.probe_bytes += _size(fields)
        try:
            header, arrays = decode_chunk(fields, expected)
        except CodecError as exc:
            return self._reject("probe", f"{key}: {exc}")
        if not all(np.isfinite(a).all() for a in arrays.values()):
            return self._reject("probe", f"{key}: non-finite values")
        return header, arrays

    def _reject(self, kind: str, reason: str) -> None:
        """Count a refused weights blob or probe under its reason; log it once per reason."""
        if kind == "weights":
            self.counters.weights_rejected += 1
        else:
            self.counters.probes_rejected += 1
        if reason not in self.rejected_reasons:
            log.warning("run %s: rejected %s", self.keys.run_id, reason)
        self.rejected_reasons[reason] = self.rejected_reasons.get(reason, 0) + 1

    def _fetch(self, version: int) -> None:
        found = read_weights(self.client, self.keys, version)  # expired meanwhile: the newest
        if found is None:
            raise RuntimeError(f"weights version {version} of run {self.keys.run_id!r} vanished")
        version, blob = found
        self.counters.weight_fetches += 1
        self.counters.weight_bytes += len(blob)
        try:
            policy = load_policy(blob)
            if not policy.takes(self.obs.row_shape):  # an MLP its size, a conv net its shape
                raise ValueError(
                    f"input {policy.input_shape} for observations of shape {self.obs.row_shape}"
                )
            held = self.policy
            if held is not None and (
                policy.input_shape != held.input_shape or policy.num_outputs != held.num_outputs
            ):
                raise ValueError("inputs or outputs differ from the version held")
        except ValueError as exc:
            reason = f"weights version {version}: {exc}"
            self._reject("weights", reason)
            if self.policy is None:
                raise WeightsRejected(reason) from None
            return  # act on with the version held; the rule asks again next chunk
        self.policy = policy
        self.version = version
        self.steps_since_fetch = 0
        self._fetched_at = time.monotonic()

    def counters_json(self) -> dict[str, int]:
        return asdict(self.counters)
