"""Transition chunks over a Redis Stream: workers write, the learner reads with a consumer group.

The reader validates every entry (codec, run id, actions against the env's action space), drops chunk ids it has already
ingested (a task Celery requeued or redelivered, or a write retried after a lost reply, brings
a chunk twice), hands good chunks to a sink, and only then acks and deletes them, so a chunk is
never lost between the stream and replay.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from typing import Any

import numpy as np
import redis

from clusterenv.pipeline.codec import (
    ArraySpec,
    CodecError,
    decode_arrays,
    decode_header,
    encode_chunk,
)
from clusterenv.pipeline.envs.faults import FAULT_KINDS
from clusterenv.pipeline.frames import FRAMES, NEXT_FRAMES, OBS_FRAMES, check_indexes
from clusterenv.pipeline.keys import RunKeys
from clusterenv.pipeline.outbox import Outbox
from clusterenv.pipeline.roles import IngestStats, Sink
from clusterenv.pipeline.spaces import ActionSpec, SpaceSpecs

log = logging.getLogger(__name__)


class StreamWriter:
    """Worker side: append one chunk (header + raw arrays) to the run's stream; with an `outbox`,
    the XADD waits there for the next sync check's round trip (or the outbox's flush)."""

    def __init__(self, client: redis.Redis, keys: RunKeys, outbox: Outbox | None = None):
        self.client, self.keys, self.outbox = client, keys, outbox

    def write(self, header: Mapping[str, Any], arrays: Mapping[str, np.ndarray]) -> int:
        fields = encode_chunk(header, arrays)
        if self.outbox is None:
            self.client.xadd(self.keys.stream, fields)
        else:
            self.outbox.hold(lambda pipe: pipe.xadd(self.keys.stream, fields))
        return sum(len(v) for v in fields.values())


def transition_specs(
    spaces: SpaceSpecs, extra: Mapping[str, ArraySpec] | None = None
) -> dict[str, ArraySpec]:
    """The arrays every chunk of an env with these `spaces` must carry, with their dtypes and
    per-row shapes, and the ones the learner's algorithm adds (`extra`: PPO's behaviour
    log-probs). Stacked frames travel once each, with indexes for `obs` and `next_obs`
    (pipeline/frames.py)."""
    if spaces.stack:
        index = ArraySpec("<i4", (spaces.stack,))
        observations = {FRAMES: spaces.frame, OBS_FRAMES: index, NEXT_FRAMES: index}
    else:
        observations = {"obs": spaces.obs, "next_obs": spaces.obs}
    return {
        **observations,
        "action": spaces.action.array,
        "reward": ArraySpec("<f4", ()),
        "terminated": ArraySpec("|b1", ()),
        "truncated": ArraySpec("|b1", ()),
        "env_index": ArraySpec("<i4", ()),
        **(extra or {}),
    }


def decode_entry(
    fields: Mapping[bytes, bytes], specs: Mapping[str, ArraySpec]
) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """Header and arrays of one stream entry. An entry without arrays is a chunk that ended in an
    env fault before its first transition: its header must say so (`env_error`); its arrays are
    {} (not zero rows: nothing reaches replay)."""
    header = decode_header(fields)  # read once: the arrays are checked against it
    if header["arrays"]:
        return header, decode_arrays(fields, header, specs)
    if "env_error" not in header:
        raise CodecError("an entry without arrays must carry 'env_error'")
    return header, {}


def check_content(
    header: dict[str, Any], arrays: dict[str, np.ndarray], run_id: str, action: ActionSpec
) -> None:
    """Semantic checks beyond the codec; raises CodecError naming the first problem."""
    if header.get("run") != run_id:
        raise CodecError(f"foreign run {header.get('run')!r}")
    for key in ("chunk", "policy_version"):
        if not isinstance(header.get(key), int) or isinstance(header.get(key), bool):
            raise CodecError(f"header field {key!r} must be an integer")
    if not isinstance(header.get("worker"), str):
        raise CodecError("header field 'worker' must be a string")
    _check_worker_report(header)
    if not arrays:  # a fault report (decode_entry)
        return
    problem = action.problem(arrays["action"])
    if problem is not None:
        raise CodecError(problem)
    if FRAMES in arrays:
        check_indexes(arrays)
    for name, a in arrays.items():
        if a.dtype.kind == "f" and not np.isfinite(a).all():
            raise CodecError(f"array {name!r} has non-finite values")


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return (_is_int(value) or isinstance(value, float)) and math.isfinite(value)


def _check_worker_report(header: dict[str, Any]) -> None:
    """The optional fields a worker reports and the learner counts (learner/run/accounting.py), in the
    form it counts them: a bad one is refused here, before its rows reach replay."""
    if "env_steps" in header and not (_is_int(header["env_steps"]) and header["env_steps"] >= 0):
        raise CodecError("header field 'env_steps' must be an integer >= 0")
    episodes = header.get("episodes", [])
    if not isinstance(episodes, list) or not all(
        isinstance(e, list) and len(e) == 2 and _is_number(e[0]) and _is_int(e[1]) for e in episodes
    ):
        raise CodecError("header field 'episodes' must be a list of [return, length] pairs")
    sync = header.get("sync", {})
    if not isinstance(sync, dict) or not all(_is_int(v) for v in sync.values()):
        raise CodecError("header field 'sync' must map counter names to integers")
    if header.get("divergence") is not None and not _is_number(header["divergence"]):
        raise CodecError("header field 'divergence' must be a finite number or null")
    fault = header.get("env_error")
    if fault is not None and not (
        isinstance(fault, dict) and fault.get("kind") in FAULT_KINDS
        and isinstance(fault.get("error"), str)
    ):  # fmt: skip
        raise CodecError(
            f"header field 'env_error' must be {{kind: one of {', '.join(FAULT_KINDS)}, error: string}}"
        )


class StreamReader:
    """Learner side: consumer-group reads with validation, de-duplication and ack-after-insert.
    Chunks carry transitions of an env with these `spaces`, and the `extra` arrays the learner's
    algorithm asks for."""

    def __init__(
        self,
        client: redis.Redis,
        keys: RunKeys,
        spaces: SpaceSpecs,
        extra: Mapping[str, ArraySpec] | None = None,
        consumer: str = "learner-0",
    ):
        self.client, self.keys, self.consumer = client, keys, consumer
        self.specs, self.action = transition_specs(spaces, extra), spaces.action
        self.seen: set[int] = set()
        self.stats = IngestStats()
        self.groups_created = 0
        self._create_group()

    def _create_group(self) -> None:
        try:
            self.client.xgroup_create(self.keys.stream, self.keys.group, id="0", mkstream=True)
            self.groups_created += 1
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
        try:
            reply = self.client.xreadgroup(
                self.keys.group, self.consumer, {self.keys.stream: ">"}, count=count, block=block_ms
            )
        except redis.ResponseError as exc:
            if "NOGROUP" not in str(exc):
                raise
            # The server lost the stream and its group (a restart without persistence): start
            # a new group; whatever it held was never accepted, and is dispatched again.
            log.warning("stream group %s is gone (broker restart?); creating it again",
                        self.keys.group)  # fmt: skip
            self._create_group()
            return 0
        return self._take(reply[0][1] if reply else [], sink)

    def claim_stale(self, sink: Sink, min_idle_ms: int, count: int = 64) -> int:
        """Take over entries delivered to some consumer but not acked for `min_idle_ms`
        (a reader that died between read and ack), and ingest them like `poll`."""
        try:
            reply = self.client.xautoclaim(
                self.keys.stream, self.keys.group, self.consumer, min_idle_ms, "0-0", count=count
            )
        except redis.ResponseError as exc:
            if "NOGROUP" not in str(exc):
                raise
            return 0
        entries = [(entry_id, fields) for entry_id, fields in reply[1] if fields]
        self.stats.claimed += len(entries)
        return self._take(entries, sink)

    def _take(self, entries: list[tuple[bytes, dict[bytes, bytes]]], sink: Sink) -> int:
        """Handle entries, then ack and delete them (only after `sink` returned for each)."""
        if not entries:
            return 0
        accepted = 0
        done: list[bytes] = []
        for entry_id, fields in entries:
            accepted += self._handle(entry_id, fields, sink)
            done.append(entry_id)
        pipe = self.client.pipeline(transaction=False)
        pipe.xack(self.keys.stream, self.keys.group, *done)
        pipe.xdel(self.keys.stream, *done)
        pipe.execute()
        return accepted

    def _handle(self, entry_id: bytes, fields: dict[bytes, bytes], sink: Sink) -> int:
        try:
            header, arrays = decode_entry(fields, self.specs)
            check_content(header, arrays, self.keys.run_id, self.action)
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
        rows = len(arrays["action"]) if arrays else 0
        self.stats.chunks += 1
        self.stats.transitions += rows
        return rows
