"""Who took which chunk. A worker notes the chunk ids of a `collect_chunk` task against its
registry name the moment it receives the task (tasks/collect.py: Celery's `task_received`, so a
prefetched task counts too); when that worker's heartbeat lapses, the learner writes those chunks
off at once (learner/run/lost_workers.py) instead of after --lost-after-s, and their share of the
dispatch quota goes to the workers still alive. A task is delivered at most once (celeryconfig):
nobody else would ever run it."""

from __future__ import annotations

from collections.abc import Iterable

import redis

from clusterenv.pipeline.keys import RUN_KEYS_TTL_S, RunKeys


class RedisChunkTakers:
    """`…:chunk-takers`, a hash chunk id → hostname: workers `note`, the learner reads (the
    ChunkTakers of pipeline/roles.py)."""

    def __init__(self, client: redis.Redis, keys: RunKeys):
        self.client, self.keys = client, keys

    def note(self, chunk_ids: Iterable[int], hostname: str) -> None:
        pipe = self.client.pipeline(transaction=False)
        pipe.hset(self.keys.chunk_takers, mapping=dict.fromkeys(chunk_ids, hostname))
        pipe.expire(self.keys.chunk_takers, RUN_KEYS_TTL_S)
        pipe.execute()

    def takers(self, chunk_ids: list[int]) -> dict[int, str]:
        if not chunk_ids:  # HMGET needs at least one field
            return {}
        raw = self.client.hmget(self.keys.chunk_takers, chunk_ids)
        return {c: h.decode() for c, h in zip(chunk_ids, raw, strict=True) if h is not None}

    def forget(self, chunk_ids: list[int]) -> None:
        if chunk_ids:  # HDEL needs at least one field
            self.client.hdel(self.keys.chunk_takers, *chunk_ids)
