"""Transition chunks over a Redis Stream: workers write, the learner reads with a consumer group.

The reader validates every entry (codec, run id, value ranges), drops chunk ids it has already
ingested (Celery redelivers a chunk whose worker died), hands good chunks to a sink, and only
then acks and deletes them, so a chunk is never lost between the stream and replay.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import redis

from pipeline.codec import ArraySpec, CodecError, decode_chunk, encode_chunk
from pipeline.keys import RunKeys
from pipeline.roles import Sink

log = logging.getLogger(__name__)


class StreamWriter:
    """Worker side: append one chunk (header + raw arrays) to the run's stream."""

    def __init__(self, client: redis.Redis, keys: RunKeys):
        self.client, self.keys = client, keys

    def write(self, header: Mapping[str, Any], arrays: Mapping[str, np.ndarray]) -> int:
        fields = encode_chunk(header, arrays)
        self.client.xadd(self.keys.stream, fields)
        return sum(len(v) for v in fields.values())


def transition_specs(obs_dtype: np.dtype, obs_shape: tuple[int, ...]) -> dict[str, ArraySpec]:
    """The arrays a DQN chunk must carry, with their dtypes and per-row shapes."""
    obs = ArraySpec(np.dtype(obs_dtype).newbyteorder("<").str, tuple(obs_shape))
    return {
        "obs": obs,
        "action": ArraySpec("<i8", ()),
        "reward": ArraySpec("<f4", ()),
        "next_obs": obs,
        "terminated": ArraySpec("|b1", ()),
        "truncated": ArraySpec("|b1", ()),
        "env_index": ArraySpec("<i4", ()),
    }


@dataclass
class IngestStats:
    chunks: int = 0
    transitions: int = 0
    duplicates: int = 0
    rejected: int = 0
    rejected_reasons: dict[str, int] = field(default_factory=dict)


def check_content(
    header: dict[str, Any], arrays: dict[str, np.ndarray], run_id: str, num_actions: int
) -> None:
    """Semantic checks beyond the codec; raises CodecError naming the first problem."""
    if header.get("run") != run_id:
        raise CodecError(f"foreign run {header.get('run')!r}")
    for key in ("chunk", "policy_version"):
        if not isinstance(header.get(key), int) or isinstance(header.get(key), bool):
            raise CodecError(f"header field {key!r} must be an integer")
    if not isinstance(header.get("worker"), str):
        raise CodecError("header field 'worker' must be a string")
    action = arrays["action"]
    if action.size and (action.min() < 0 or action.max() >= num_actions):
        raise CodecError(f"action outside [0, {num_actions})")
    for name in ("obs", "next_obs", "reward"):
        a = arrays[name]
        if a.dtype.kind == "f" and not np.isfinite(a).all():
            raise CodecError(f"array {name!r} has non-finite values")


class StreamReader:
    """Learner side: consumer-group reads with validation, de-duplication and ack-after-insert."""

    def __init__(
        self,
        client: redis.Redis,
        keys: RunKeys,
        specs: Mapping[str, ArraySpec],
        num_actions: int,
        consumer: str = "learner-0",
    ):
        self.client, self.keys, self.specs = client, keys, dict(specs)
        self.num_actions, self.consumer = num_actions, consumer
        self.seen: set[int] = set()
        self.stats = IngestStats()
        try:
            client.xgroup_create(keys.stream, keys.group, id="0", mkstream=True)
        except redis.ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise

    def poll(
        self,
        sink: Sink,
        block_ms: int = 100,
        count: int = 64,
    ) -> int:
        """Read up to `count` entries (waiting up to `block_ms`), feed good chunks to `sink`.

        Returns the number of transitions accepted. Entries are acked and deleted only after
        `sink` returned; a sink that raises leaves them pending for the next reader.
        """
        reply = self.client.xreadgroup(
            self.keys.group, self.consumer, {self.keys.stream: ">"}, count=count, block=block_ms
        )
        if not reply:
            return 0
        accepted = 0
        done: list[bytes] = []
        for entry_id, fields in reply[0][1]:
            accepted += self._handle(entry_id, fields, sink)
            done.append(entry_id)
        pipe = self.client.pipeline(transaction=False)
        pipe.xack(self.keys.stream, self.keys.group, *done)
        pipe.xdel(self.keys.stream, *done)
        pipe.execute()
        return accepted

    def _handle(self, entry_id: bytes, fields: dict[bytes, bytes], sink: Sink) -> int:
        try:
            header, arrays = decode_chunk(fields, self.specs)
            check_content(header, arrays, self.keys.run_id, self.num_actions)
        except CodecError as exc:
            self.stats.rejected += 1
            reason = str(exc)
            self.stats.rejected_reasons[reason] = self.stats.rejected_reasons.get(reason, 0) + 1
            log.warning("rejected stream entry %s: %s", entry_id.decode(), reason)
            return 0
        chunk_id = header["chunk"]
        if chunk_id in self.seen:
            self.stats.duplicates += 1
            log.info("dropped duplicate chunk %d from %s", chunk_id, header["worker"])
            return 0
        sink(header, arrays)
        self.seen.add(chunk_id)
        rows = len(arrays["action"])
        self.stats.chunks += 1
        self.stats.transitions += rows
        return rows
