"""The worker registry: each worker announces its process count under an expiring key; the learner,
the dispatcher and the remote env count live processes from those keys. A worker that only takes
evaluation (`-Q clusterenv:eval`) says so and is counted apart: no chunk is dispatched for it."""

from __future__ import annotations

import contextlib
import json

import redis

from clusterenv.pipeline.cluster.heartbeat import Heartbeat
from clusterenv.pipeline.keys import WORKER_HEARTBEAT_PATTERN, worker_heartbeat


class WorkerRegistry:
    """Reads and writes `clusterenv:worker:{hostname}` keys (value: JSON with the process count
    and whether the worker only evaluates). The learner's WorkerDirectory (pipeline/roles.py)."""

    def __init__(self, client: redis.Redis):
        self.client = client

    def announce(
        self, hostname: str, processes: int, ttl_s: float, eval_only: bool = False
    ) -> None:
        value = json.dumps({"processes": processes, "eval_only": eval_only})
        self.client.set(worker_heartbeat(hostname), value, px=int(ttl_s * 1000))

    def withdraw(self, hostname: str) -> None:
        with contextlib.suppress(redis.RedisError):  # the key expires by itself anyway
            self.client.delete(worker_heartbeat(hostname))

    def alive_processes(self, eval_only: bool = False) -> int:
        """Sum of the process counts announced by live worker heartbeats on this broker: workers
        that collect (and may evaluate), or with `eval_only` those that only evaluate."""
        keys = list(self.client.scan_iter(match=WORKER_HEARTBEAT_PATTERN, count=1000))
        total = 0
        for raw in self.client.mget(keys) if keys else []:
            if raw is None:
                continue
            try:
                value = json.loads(raw)
                if bool(value.get("eval_only", False)) == eval_only:
                    total += int(value.get("processes", 1))
            except (ValueError, AttributeError):
                total += 0 if eval_only else 1
        return total

    def is_alive(self, hostname: str) -> bool:
        """Whether `hostname`'s heartbeat key is still there (announced and not yet lapsed)."""
        return bool(self.client.exists(worker_heartbeat(hostname)))

    def keep_alive(
        self, hostname: str, processes: int, every_s: float, ttl_s: float, eval_only: bool = False
    ) -> Heartbeat:
        """Announce now, then from a heartbeat thread every `every_s` (started; `stop()` it)."""
        self.announce(hostname, processes, ttl_s, eval_only)
        beat = Heartbeat(
            f"heartbeat-{hostname}",
            lambda: self.announce(hostname, processes, ttl_s, eval_only),
            every_s,
        )
        beat.start()
        return beat
