"""Greedy evaluation, requested from the workers (the learner process never steps an env), and
its schedule: when to ask, when to give up, what the results so far say.

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
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from clusterenv.learner.config import EvalConfig
from clusterenv.pipeline.chunks.actor import eval_seeds
from clusterenv.pipeline.evaluation.request import EVALUATE_TASK, EvalRequest
from clusterenv.pipeline.roles import EvalResults, SendTask, WorkerDirectory

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
    """Sends `clusterenv.evaluate` parts through `send`; collects their results from `board`.
    A worker cuts a part off after `time_limit_s` (a hung env: it answers with the fault)."""

    def __init__(
        self,
        run_id: str,
        board: EvalResults,
        workers: WorkerDirectory,
        send: SendTask,
        env_id: str,
        env_kwargs: dict,
        episodes: int,
        seed: int,
        clock: Callable[[], float] = time.monotonic,
        time_limit_s: float = 0.0,
    ):
        self.run_id, self.board, self.workers, self.send = run_id, board, workers, send
        self.env_id, self.env_kwargs, self.episodes, self.seed = env_id, env_kwargs, episodes, seed
        self.time_limit_s, self.clock = time_limit_s, clock
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
            req = EvalRequest(self.run_id, eval_id, part, version, self.env_id, block,
                              self.env_kwargs, self.time_limit_s)  # fmt: skip
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
        gone = [host for host in sorted(set(self.board.takers(missing)))
                if not self.workers.is_alive(host)]  # fmt: skip
        # A worker pushes its result before its heartbeat goes: with one unread, wait a turn.
        if not gone or self.board.unread():
            return None
        return gone[0]

    def results(self) -> Iterator[EvalResult]:
        """Evaluations whose every part has arrived since the last call."""
        while True:
            raw = self.board.pop()
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
            self.board.forget(fields)

    def save(self) -> tuple[dict[str, np.ndarray], dict[str, int]]:
        """The evaluation ids used and errors seen; one in flight dies with this learner's run id
        (the schedule asks for it again)."""
        return {}, {"next_id": self.next_id, "errors": self.errors}

    def restore(self, arrays: Mapping[str, np.ndarray], values: Mapping[str, Any]) -> None:
        self.next_id, self.errors = values["next_id"], values["errors"]


class EvalSchedule:
    """When to evaluate and what the results say: every `eval_every` env steps, and once more when
    the budget is spent; one request at a time; an evaluation older than `eval_timeout_s`, or one
    of whose parts was taken by a worker that is gone, is given up. `solve_evals` consecutive
    results at the target solve the run."""

    def __init__(self, cfg: EvalConfig, evaluation: RemoteEvaluation, target: float | None):
        self.cfg, self.evaluation, self.target = cfg, evaluation, target
        self.next_eval, self.asked_at = cfg.eval_every, -1  # env steps
        self.evals: list[tuple[int, float]] = []  # (env steps, mean return) per evaluation
        self.hits, self.solved = 0, False  # consecutive evaluations at the target; solved yet

    @property
    def last_mean(self) -> float:
        return self.evals[-1][1] if self.evals else float("nan")

    @property
    def best_mean(self) -> float:
        return max((m for _, m in self.evals), default=-np.inf)

    def tick(self, env_steps: int, out_of_work: bool, request: Callable[[], None]) -> None:
        """Call `request()` (which asks the workers) when an evaluation is due; give up one that
        takes too long or lost its worker."""
        ev, pending = self.evaluation, self.evaluation.pending
        if pending is None:
            if env_steps >= self.next_eval or (out_of_work and self.asked_at != env_steps):
                self.next_eval, self.asked_at = env_steps + self.cfg.eval_every, env_steps
                request()
        elif ev.waiting_s() > self.cfg.eval_timeout_s:
            log.warning("evaluation of v%d at %d env steps took over %.0f s; given up",
                        pending.result.version, self.asked_at, self.cfg.eval_timeout_s)  # fmt: skip
            ev.abandon()
        elif (gone := ev.lost_to()) is not None:
            log.warning("evaluation of v%d at %d env steps: worker %s is gone; given up",
                        pending.result.version, self.asked_at, gone)  # fmt: skip
            ev.abandon()

    def results(self) -> Iterator[tuple[EvalResult, float]]:
        """Each finished evaluation with its mean return, counted towards solving."""
        for result in self.evaluation.results():
            mean = float(result.returns.mean())
            self.evals.append((result.env_steps, mean))
            self.hits = self.hits + 1 if self.target is not None and mean >= self.target else 0
            self.solved = self.solved or self.hits >= self.cfg.solve_evals
            yield result, mean

    def done(self, env_steps: int, out_of_work: bool) -> bool:
        """Solved, or out of work with the final evaluation recorded (or given up)."""
        final = out_of_work and self.evaluation.pending is None and self.asked_at == env_steps
        return self.solved or final

    def save(self) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        pending = self.evaluation.pending is not None
        return {}, {
            # An evaluation still in flight dies with this learner's run id: ask again on resume.
            "next_eval": self.asked_at if pending else self.next_eval,
            "asked_at": -1 if pending else self.asked_at,
            "evals": self.evals,
            "hits": self.hits,
        }

    def restore(self, arrays: Mapping[str, np.ndarray], values: Mapping[str, Any]) -> None:
        self.next_eval, self.asked_at, self.hits = (
            values["next_eval"],
            values["asked_at"],
            values["hits"],
        )
        self.evals = [(int(steps), float(mean)) for steps, mean in values["evals"]]
