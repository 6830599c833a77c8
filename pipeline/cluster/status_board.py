"""Every run's progress on the broker, for operators: one JSON status per run that
`clusterenv status` reads from any machine that reaches the broker (the learner's StatusBoard)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import redis

from clusterenv.pipeline.keys import RUN_KEYS_TTL_S, RUN_STATUS_PATTERN, RunKeys


class RedisStatusBoard:
    """StatusBoard on Redis: `clusterenv:run:{run_id}:status` per run, expiring with its keys."""

    def __init__(self, client: redis.Redis):
        self.client = client

    def write(self, run_id: str, status: Mapping[str, Any]) -> None:
        """SET the run's status as JSON (values JSON lacks, as their str); raises redis errors."""
        value = json.dumps(dict(status), default=str)
        self.client.set(RunKeys(run_id).status, value, ex=RUN_KEYS_TTL_S)

    def read_all(self) -> list[dict[str, Any]]:
        """Every run status on the broker, the most recently updated first."""
        keys = sorted(self.client.scan_iter(match=RUN_STATUS_PATTERN, count=1000))
        statuses = []
        for raw in self.client.mget(keys) if keys else []:
            try:
                status = json.loads(raw)
            except (TypeError, ValueError):  # expired between SCAN and MGET, or not JSON
                continue
            if isinstance(status, dict):  # any other JSON under a status key is not ours
                statuses.append(status)
        return sorted(statuses, key=lambda s: s.get("updated_at", 0), reverse=True)
