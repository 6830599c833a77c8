"""The learner's progress on the broker, for operators: a JSON status per run that
`clusterenv status` reads from any machine that reaches the broker (workers, Flower, a laptop)."""

from __future__ import annotations

import json
import logging
import time
from typing import Any

import redis

from clusterenv.pipeline.keys import RUN_KEYS_TTL_S, RUN_STATUS_PATTERN, RunKeys

log = logging.getLogger(__name__)

# A SET every few seconds costs the broker nothing and keeps the status fresher than the
# learner's log line (every --status-every-s, 30 s by default).
STATUS_EVERY_S = 5.0


class RunStatus:
    """Writes one run's status: `running` while it trains, its end state once it stops."""

    def __init__(
        self, client: redis.Redis, keys: RunKeys, env: str, every_s: float = STATUS_EVERY_S
    ):
        self.client, self.key, self.every_s = client, keys.status, every_s
        self.fixed = {"run_id": keys.run_id, "env": env}
        self.last: dict[str, Any] = {}  # the figures of the latest `running` status
        self._at = -float("inf")

    def due(self) -> bool:
        return time.monotonic() - self._at >= self.every_s

    def publish(self, state: str, figures: dict[str, Any]) -> None:
        """Best effort: a status that cannot be written is logged, never a reason to stop a run."""
        self._at = time.monotonic()
        status = {**self.fixed, "state": state, **figures, "updated_at": round(time.time(), 3)}
        try:
            self.client.set(self.key, json.dumps(status, default=str), ex=RUN_KEYS_TTL_S)
        except redis.RedisError as exc:
            log.warning("could not write the run status: %s", exc)

    def running(self, figures: dict[str, Any]) -> None:
        self.last = figures
        self.publish("running", figures)

    def finish(self, summary: dict[str, Any]) -> None:
        """The run's end state and final figures, from its summary.json contents."""
        state = (
            "failed" if summary.get("failed") else "interrupted" if summary.get("interrupted")
            else "solved" if summary.get("solved") else "budget spent"
        )  # fmt: skip
        final = {k: summary[k] for k in ("env_steps", "updates", "wall_s") if k in summary}
        self.publish(state, {**self.last, **final})


def read_statuses(client: redis.Redis) -> list[dict[str, Any]]:
    """Every run status on the broker, the most recently updated first."""
    keys = sorted(client.scan_iter(match=RUN_STATUS_PATTERN, count=1000))
    values = client.mget(keys) if keys else []
    statuses = []
    for raw in values:
        try:
            statuses.append(json.loads(raw))
        except (TypeError, ValueError):  # expired between SCAN and MGET, or not ours
            continue
    return sorted(statuses, key=lambda s: s.get("updated_at", 0), reverse=True)


def status_line(status: dict[str, Any], now: float) -> str:
    figures = [
        f"steps {status.get('env_steps', '?')}/{status.get('total_steps', '?')}",
        f"{status.get('steps_per_s', 0):.0f} steps/s",
        f"eval {status['last_eval']:.1f}" if status.get("last_eval") is not None else "eval -",
        f"v{status.get('policy_version', '?')}",
        f"weight fetches {status.get('weight_fetches', '?')}",
        f"updated {now - status.get('updated_at', now):.0f} s ago",
    ]
    return f"{status.get('run_id')}  {status.get('env')}  {status.get('state')}  " + "  ".join(
        figures
    )
