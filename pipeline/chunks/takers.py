"""Who took which chunk. A worker notes the chunk ids of a `collect_chunk` task against its
registry name as the task starts, in the round trip of its first sync check (pipeline/chunks/
runtime.py: no round trip of its own); when that worker's heartbeat lapses, the learner writes
those chunks off at once (learner/run/lost_workers.py) instead of after --lost-after-s, and their
share of the dispatch quota goes to the workers still alive. A task is delivered at most once
(celeryconfig), and with acks late and a prefetch multiplier of 1 a worker holds no task it has
not started: a dead worker's tasks are the ones it noted."""

from __future__ import annotations

from collections.abc import Iterable

import redis
from redis.client import Pipeline

from clusterenv.pipeline.keys import RUN_KEYS_TTL_S, RunKeys


class RedisChunkTakers:
    """`…:chunk-takers`, a hash chunk id → hostname: workers `note`, the learner reads (the
    ChunkTakers of pipeline/roles.py)."""

    def __init__(self, client: redis.Redis, keys: RunKeys):
        self.client, self.keys = client, keys

    def note(self, chunk_ids: Iterable[int], hostname: str, pipe: Pipeline | None = None) -> None:
        """`hostname` took `chunk_ids`; on `pipe` (sent with its other commands) if given."""
        own = pipe is None
        pipe = self.client.pipeline(transaction=False) if pipe is None else pipe
        pipe.hset(self.keys.chunk_takers, mapping=dict.fromkeys(chunk_ids, hostname))
        pipe.expire(self.keys.chunk_takers, RUN_KEYS_TTL_S)
        if own:
            pipe.execute()

    def takers(self, chunk_ids: list[int]) -> dict[int, str]:
        if not chunk_ids:  # HMGET needs at least one field
            return {}
        raw = self.client.hmget(self.keys.chunk_takers, chunk_ids)
        return {c: h.decode() for c, h in zip(chunk_ids, raw, strict=True) if h is not None}

    def forget(self, chunk_ids: list[int]) -> None:
        if chunk_ids:  # HDEL needs at least one field
            self.client.hdel(self.keys.chunk_takers, *chunk_ids)
