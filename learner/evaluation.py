"""Greedy evaluation, requested from the workers: the learner process never steps an env.

One evaluation at a time is in flight, split into at most `eval_tasks` parts (a budget of worker
processes), so evaluation never takes more than that share of the workers from collection. Each
result is recorded against the version and the env step it was asked about. A worker notes each
part it takes; when its heartbeat lapses before the part's result came, the evaluation is lost
(Celery delivers a task once, so nobody else will answer it).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import numpy as np
import redis

from clusterenv.pipeline.chunks.actor import eval_seeds
from clusterenv.pipeline.evaluation.request import EVALUATE_TASK, EvalRequest
from clusterenv.pipeline.keys import RunKeys, worker_heartbeat
from clusterenv.pipeline.roles import SendTask

log = logging.getLogger(__name__)


@dataclass
class EvalResult:
    """A finished evaluation: the version and env step it was asked about, and its returns."""

    eval_id: int
    version: int
    env_steps: int
    requested_at: float
    returns: np.ndarray
    versions_evaluated: set[int] = field(default_factory=set)


@dataclass
class _Pending:
    result: EvalResult
    parts: int
    returns: dict[int, list[float]] = field(default_factory=dict)


class RemoteEvaluation:
    """Sends `clusterenv.evaluate` parts through `send`; collects their results from Redis."""

    def __init__(
        self,
        client: redis.Redis,
        keys: RunKeys,
        send: SendTask,
        env_id: str,
        env_kwargs: dict,
        episodes: int,
        seed: int,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.client, self.keys, self.send = client, keys, send
        self.env_id, self.env_kwargs, self.episodes, self.seed = env_id, env_kwargs, episodes, seed
        self.clock = clock
        self.next_id = 0
        self.pending: _Pending | None = None
        self.errors = 0
        self._looked_at = -float("inf")

    def request(self, version: int, env_steps: int, parts: int) -> None:
        """Ask for `episodes` greedy episodes of `version`, split over `parts` tasks."""
        assert self.pending is None, "one evaluation at a time"
        eval_id, n = self.next_id, self.episodes
        self.next_id += 1
        seeds = eval_seeds(self.seed, eval_id, n)
        blocks = [b.tolist() for b in np.array_split(np.array(seeds), min(parts, n))]
        for part, block in enumerate(blocks):
            req = EvalRequest(
                self.keys.run_id, eval_id, part, version, self.env_id, block, self.env_kwargs
            )
            self.send(EVALUATE_TASK, req.to_json())
        result = EvalResult(eval_id, version, env_steps, self.clock(), np.zeros(0))
        self.pending = _Pending(result, len(blocks))

    def waiting_s(self) -> float:
        return self.clock() - self.pending.result.requested_at if self.pending else 0.0

    def lost_to(self) -> str | None:
        """The worker that took a part of the evaluation in flight and is gone (its heartbeat
        key lapsed) without returning it, or None. Looks at most once a second."""
        p, now = self.pending, self.clock()
        if p is None or now - self._looked_at < 1.0:
            return None
        self._looked_at = now
        missing = [f"{p.result.eval_id}:{part}" for part in range(p.parts) if part not in p.returns]
        if not missing:
            return None
        takers = {raw.decode() for raw in self.client.hmget(self.keys.eval_takers, missing) if raw}
        gone = [host for host in sorted(takers) if not self.client.exists(worker_heartbeat(host))]
        # A worker pushes its result before its heartbeat goes: with one unread, wait a turn.
        if not gone or self.client.llen(self.keys.eval_results):
            return None
        return gone[0]

    def results(self) -> Iterator[EvalResult]:
        """Evaluations whose every part has arrived since the last call."""
        while True:
            raw = self.client.lpop(self.keys.eval_results)
            if raw is None:
                return
            done = self._take(raw)
            if done is not None:
                yield done

    def _take(self, raw: bytes) -> EvalResult | None:
        try:
            msg = json.loads(raw)
            eval_id, part, version = int(msg["eval"]), int(msg["part"]), int(msg["version"])
        except (ValueError, KeyError, TypeError) as exc:
            self.errors += 1
            log.warning("bad eval result %r: %s", raw[:200], exc)
            return None
        p = self.pending
        if p is None or eval_id != p.result.eval_id or part in p.returns:
            return None  # a redelivered part, or the late answer to an abandoned evaluation
        if "error" in msg or not isinstance(msg.get("returns"), list):
            self.errors += 1
            log.warning("evaluation %d part %d failed: %s", eval_id, part, msg.get("error"))
            p.returns[part] = []
        else:
            p.returns[part] = [float(r) for r in msg["returns"]]
            p.result.versions_evaluated.add(version)
        if len(p.returns) < p.parts:
            return None
        p.result.returns = np.array([r for i in sorted(p.returns) for r in p.returns[i]])
        self._done_with()
        return p.result if len(p.result.returns) else None

    def abandon(self) -> None:
        """Give up the evaluation in flight (its late parts are ignored)."""
        self._done_with()

    def _done_with(self) -> None:
        """No evaluation in flight; the finished or abandoned one's takers leave the broker."""
        p, self.pending = self.pending, None
        if p is not None:
            fields = [f"{p.result.eval_id}:{part}" for part in range(p.parts)]
            self.client.hdel(self.keys.eval_takers, *fields)
