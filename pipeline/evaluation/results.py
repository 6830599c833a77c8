"""Learner side of evaluation on the broker: the parts' results (a list the workers RPUSH to) and
who took each part (a hash the workers note themselves in): the learner's EvalResults."""

from __future__ import annotations

import redis

from clusterenv.pipeline.keys import RunKeys


class RedisEvalResults:
    """EvalResults on Redis: `…:evals` (JSON results, LPOP in order) and `…:eval-takers`."""

    def __init__(self, client: redis.Redis, keys: RunKeys):
        self.client, self.keys = client, keys

    def pop(self) -> bytes | None:
        return self.client.lpop(self.keys.eval_results)

    def unread(self) -> int:
        return int(self.client.llen(self.keys.eval_results))

    def takers(self, fields: list[str]) -> list[str]:
        """The hostnames noted against `fields`, in that order; fields nobody took are skipped."""
        if not fields:  # HMGET needs at least one field
            return []
        return [raw.decode() for raw in self.client.hmget(self.keys.eval_takers, fields) if raw]

    def forget(self, fields: list[str]) -> None:
        if fields:  # HDEL needs at least one field
            self.client.hdel(self.keys.eval_takers, *fields)
