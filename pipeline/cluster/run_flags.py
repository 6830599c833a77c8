"""A run's marks on the broker: the start marker the learner checks for a lost broker, and the stop
flag that ends the run for workers and lets its keys expire (the learner's RunFlags)."""

from __future__ import annotations

import redis

from clusterenv.pipeline.keys import RUN_KEYS_TTL_S, RunKeys


class RedisRunFlags:
    """RunFlags on Redis: `…:marker` while the run is known to the broker, `…:stopped` once it ended."""

    def __init__(self, client: redis.Redis, keys: RunKeys):
        self.client, self.keys = client, keys

    def mark_started(self) -> None:
        """Set the marker: a broker that later lacks it has lost the run's keys (a restart without
        persistence), whatever the learner has re-written since."""
        self.client.set(self.keys.marker, 1)

    def mark_stopped(self) -> None:
        """Set the stop key (queued chunks return at once, workers drop the run's envs) and let the
        run's keys expire; stream entries nobody will read go with them."""
        keys = self.keys
        pipe = self.client.pipeline(transaction=False)
        pipe.set(keys.stop, 1, ex=RUN_KEYS_TTL_S)
        for key in (
            keys.stream,
            keys.actor_counter,
            keys.actor_slots,
            keys.weights_latest,
            keys.marker,
        ):
            pipe.expire(key, RUN_KEYS_TTL_S)
        pipe.execute()

    def lost(self) -> bool:
        # The marker, not `weights:latest`: the learner's own next publish may re-create that.
        return not self.client.exists(self.keys.marker)
