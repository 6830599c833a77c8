"""Client side of the remote env: places shards through Celery, talks to them over Redis lists.

Placement goes through Celery (any `celery worker` on the broker can host a shard); step traffic
goes over one request list per shard and one reply list per env, because a blocking list pop is
several times cheaper than a Celery task round trip (bench/remote_env.py measures both). A step
costs the client one round trip (all RPUSHes and the first BLMPOP in one pipeline) when the
replies are quick, and each shard one (its reply RPUSH and its next BLPOP pipelined).
A shard whose heartbeat lapses is reported lost to the caller (pipeline/remote_env/columns.py
re-homes its envs).
"""

from __future__ import annotations

import logging
import time
import uuid
from dataclasses import dataclass
from typing import Any

import numpy as np
from gymnasium.vector import AutoresetMode

from clusterenv.pipeline.cluster.celery_client import celery_client
from clusterenv.pipeline.cluster.heartbeat import Heartbeat
from clusterenv.pipeline.cluster.registry import WorkerRegistry
from clusterenv.pipeline.connect import connect, redact
from clusterenv.pipeline.keys import ShardKeys, remote_env_client, remote_env_replies
from clusterenv.pipeline.remote_env.messages import (
    CLOSE,
    HELLO,
    HOST_SHARD_TASK,
    EnvTarget,
    Message,
    RemoteEnvOptions,
    ShardSpec,
    pack,
    unpack,
)

# A waiting BLPOP wakes this often to check the heartbeats of the shards it waits on.
POLL_S = 0.25
# With an automatic shard count, shards not started this long after the first are given up.
PLACEMENT_GRACE_S = 3.0

log = logging.getLogger(__name__)


class RemoteEnvError(RuntimeError):
    """An env raised on its worker (or could not be built there); the remote traceback is kept.

    `errors` lists each failure ({env, where, type, message, traceback}); after a failed
    `step`, `result` holds the step's 5-tuple with the failed envs reported truncated.
    """

    def __init__(self, message: str, errors: list[dict[str, Any]], result: Any = None):
        super().__init__(message)
        self.errors, self.result = errors, result


class PlacementError(RuntimeError):
    """No worker started a shard in time."""


class ShardTimeout(TimeoutError):
    """A live shard did not answer in time."""


@dataclass
class ShardRef:
    """The client's view of one placed shard."""

    id: int
    keys: ShardKeys
    envs: list[int]
    worker: str = "no worker yet"
    pid: int = 0
    seq: int = 0

    def describe(self) -> str:
        return f"shard {self.id} (envs {self.envs}) on {self.worker} pid {self.pid}"


class ShardGroup:
    """All shards of one remote vector env; each env column always belongs to exactly one shard."""

    def __init__(
        self,
        redis_url: str,
        env: EnvTarget,
        num_envs: int,
        shards: int | None,
        options: RemoteEnvOptions,
        autoreset: AutoresetMode = AutoresetMode.NEXT_STEP,
    ):
        self.redis_url, self.env, self.num_envs = redis_url, env, num_envs
        self.env_id, self.options, self.autoreset = env.env_id, options, autoreset
        self.timeout_s, self.placement_timeout_s = options.timeout_s, options.placement_timeout_s
        self.session = uuid.uuid4().hex[:12]
        self.replies = remote_env_replies(self.session)
        self.redis = connect(redis_url, blocking=True)
        self.registry = WorkerRegistry(self.redis)
        self.celery = celery_client(redis_url)
        # Unset: one shard per idle worker process (a process hosting a shard stops beating).
        self.auto_shards = shards is None
        if shards is None:
            shards = max(1, min(num_envs, self.registry.alive_processes()))
        self.num_shards = max(1, min(shards, num_envs))
        self.live: dict[int, ShardRef] = {}
        self.retired: list[ShardRef] = []
        self.next_id = 0
        self.hello: dict[str, Any] = {}
        # The client's own liveness key, so shards of a crashed client free their workers.
        self.client_ttl_s = max(5.0, 2 * options.heartbeat_ttl_s)
        self.beat = Heartbeat(
            "remote-env-client-beat", self._beat_client, every_s=self.client_ttl_s / 4
        )

    def _beat_client(self) -> None:
        self.redis.set(remote_env_client(self.session), "1", px=int(self.client_ttl_s * 1000))

    # --- placement ---

    def start(self) -> list[list[int]]:
        """Place the shards (contiguous blocks of columns); returns blocks no worker took."""
        self._beat_client()
        self.beat.start()
        blocks = np.array_split(np.arange(self.num_envs), self.num_shards)
        return self.place([b.tolist() for b in blocks], all_required=not self.auto_shards)

    def place(self, blocks: list[list[int]], *, all_required: bool = True) -> list[list[int]]:
        """Send one host_shard task per block and wait for the hellos; returns blocks left over.

        With `all_required=False`, blocks still unstarted PLACEMENT_GRACE_S after the first hello
        are given up (their tasks are told to close, so a late start exits at once).
        """
        new = []
        for envs in blocks:
            ref = ShardRef(self.next_id, ShardKeys(self.session, self.next_id), envs)
            self.next_id += 1
            spec = ShardSpec(
                self.session, ref.id, self.env_id, envs, self.options.heartbeat_ttl_s,
                self.options.idle_timeout_s, self.env.env_kwargs, self.env.env_spec,
                self.autoreset.value, self.options.note_types,
            )  # fmt: skip
            self.celery.send_task(HOST_SHARD_TASK, kwargs=spec.to_json())
            self.retired.append(ref)  # until its hello arrives; close() reaches it either way
            new.append(ref)
        pending = {ref.id: ref for ref in new}
        deadline = time.monotonic() + self.placement_timeout_s
        first_hello = 0.0
        while pending:
            left = deadline - time.monotonic()
            if not all_required and self.live:
                left = min(left, first_hello + PLACEMENT_GRACE_S - time.monotonic())
                if left <= 0:
                    self._abandon(list(pending.values()))
                    return [ref.envs for ref in pending.values()]
            msgs = self._pop(len(pending), min(1.0, max(0.01, left)))
            if not msgs and left <= 0:
                raise PlacementError(self._placement_message(list(pending.values())))
            for msg in msgs:
                ref = pending.pop(msg.shard, None)
                if ref is None or msg.op != HELLO:
                    continue  # a stale answer from an earlier shard
                first_hello = first_hello or time.monotonic()
                ref.worker = str(msg.extra.get("worker", "unknown worker"))
                ref.pid = int(msg.extra.get("pid", 0))
                if msg.extra.get("errors"):
                    raise remote_error(f"could not build {self.env_id!r}", msg.extra["errors"], ref)
                self.retired.remove(ref)
                self.live[ref.id] = ref
                if not self.hello:
                    self.hello = msg.tree
        return []

    def _abandon(self, refs: list[ShardRef]) -> None:
        pipe = self.redis.pipeline(transaction=False)
        for ref in refs:
            ref.seq += 1
            pipe.rpush(ref.keys.requests, pack(Message(CLOSE, ref.seq, [])))
            pipe.expire(ref.keys.requests, 60)
        pipe.execute()

    def _placement_message(self, refs: list[ShardRef]) -> str:
        alive = self.registry.alive_processes()
        envs = sorted(i for r in refs for i in r.envs)
        return (
            f"{len(refs)} shard(s) of {self.env_id!r} (envs {envs}) were not started by any worker "
            f"within {self.placement_timeout_s:.0f} s; {alive} idle worker process(es) on "
            f"{redact(self.redis_url)}. A shard holds one worker process while its env is open: start "
            f"more workers (`celery -A clusterenv.tasks worker`), close other remote envs, or pass shards=..."
        )

    def _pop(self, count: int, timeout: float, pipe: Any = None) -> list[Message]:
        """Up to `count` replies, waiting up to `timeout` for the first (BLMPOP, Redis >= 7)."""
        if pipe is None:
            got = self.redis.blmpop(timeout, 1, self.replies, direction="LEFT", count=count)
        else:
            pipe.blmpop(timeout, 1, self.replies, direction="LEFT", count=count)
            got = pipe.execute()[-1]
        return [unpack(blob) for blob in got[1]] if got else []

    def exchange(self, requests: dict[int, Message]) -> tuple[dict[int, Message], list[ShardRef]]:
        """Send one request per shard, gather the replies; shards found dead come back as lost."""
        pipe = self.redis.pipeline(transaction=False)
        for sid, msg in requests.items():
            ref = self.live[sid]
            ref.seq += 1
            msg.seq = ref.seq
            pipe.rpush(ref.keys.requests, pack(msg))
        pending = {sid: self.live[sid] for sid in requests}
        # The requests and the first wait for replies share one round trip.
        msgs = self._pop(len(pending), POLL_S, pipe)
        replies: dict[int, Message] = {}
        lost: list[ShardRef] = []
        deadline = time.monotonic() + self.timeout_s
        while True:
            for msg in msgs:
                ref = pending.get(msg.shard)
                if ref is None or msg.seq != ref.seq:
                    continue  # the late answer to a request that timed out, or a lost shard's
                if "fatal" in msg.extra:
                    raise RemoteEnvError(f"{ref.describe()}: {msg.extra['fatal']}", [])
                del pending[msg.shard]
                replies[ref.id] = msg
            if not pending:
                return replies, lost
            if not msgs:
                lost += self._drop_dead(pending)
                if pending and time.monotonic() > deadline:
                    names = "; ".join(r.describe() for r in pending.values())
                    op = next(iter(requests.values())).op
                    raise ShardTimeout(
                        f"no answer to {op} within {self.timeout_s:g} s from {names}, "
                        f"though its heartbeat is alive: is an env stuck in {op}()?"
                    )
                if not pending:
                    return replies, lost
            msgs = self._pop(len(pending), POLL_S)

    def _drop_dead(self, pending: dict[int, ShardRef]) -> list[ShardRef]:
        refs = list(pending.values())
        pipe = self.redis.pipeline(transaction=False)
        for ref in refs:
            pipe.exists(ref.keys.heartbeat)
        dead = []
        for ref, alive in zip(refs, pipe.execute(), strict=True):
            if not alive:
                log.warning("lost %s: its heartbeat lapsed; re-placing its envs", ref.describe())
                self.redis.delete(ref.keys.heartbeat)  # disown: a paused shard must not come back
                del pending[ref.id], self.live[ref.id]
                self.retired.append(ref)
                dead.append(ref)
        return dead

    # --- shutdown ---

    def close(self, wait_s: float = 5.0) -> None:
        """Tell every shard ever placed to close, wait briefly for live ones, delete the keys."""
        self.beat.stop()
        try:
            self._abandon([*self.live.values(), *self.retired])
            # Waiting for the acks means the workers are free again when close() returns.
            pending = dict(self.live)
            deadline = time.monotonic() + wait_s
            while pending and time.monotonic() < deadline:
                msgs = self._pop(len(pending), 0.2)
                for msg in msgs:
                    if msg.op == CLOSE:
                        pending.pop(msg.shard, None)
                if not msgs:
                    for sid, ref in list(pending.items()):
                        if not self.redis.exists(ref.keys.heartbeat):
                            del pending[sid]  # gone already: nothing will answer
            self.redis.delete(remote_env_client(self.session), self.replies)
        finally:
            self.live.clear()
            self.celery.close()
            self.redis.close()


def remote_error(what: str, errors: list[dict[str, Any]], ref: ShardRef) -> RemoteEnvError:
    first = errors[0]
    return RemoteEnvError(
        f"{what} on {ref.describe()}: env {first['env']} raised in {first['where']}: "
        f"{first['type']}: {first['message']}\n--- remote traceback ---\n{first['traceback']}",
        [{**e, "worker": f"{ref.worker} pid {ref.pid}", "shard": ref.id} for e in errors],
    )
