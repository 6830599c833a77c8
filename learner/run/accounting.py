"""Run accounting: env steps, policy lag, divergence, the workers' sync counters and episodes.

Everything is counted from the chunks the learner accepted (their headers carry the behaviour
version, the divergence the worker measured and its cumulative sync counters).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from clusterenv.learner.run.ingest import Arrival
from clusterenv.pipeline.envs.faults import FAULT_KINDS


def id_ranges(ids: set[int]) -> list[list[int]]:
    """Integers as inclusive [first, last] runs: the accepted chunk ids, short in summary.json."""
    runs: list[list[int]] = []
    for i in sorted(ids):
        if runs and i == runs[-1][1] + 1:
            runs[-1][1] = i
        else:
            runs.append([i, i])
    return runs


class RunAccounting:
    def __init__(self) -> None:
        self.env_steps = 0
        self.lag_versions: list[int] = []
        self.lag_updates: list[int] = []
        self.divergences: list[tuple[float, int]] = []  # (D, index of its chunk in the lag lists)
        self.worker_sync: dict[str, dict[str, int]] = {}
        self.episode_returns: list[float] = []
        self.broker_recoveries = 0  # times the broker had lost the run's state and got it back
        # Sync counters of the learners this run had before a resume (their workers' counters
        # started again from zero under the resumed run's id).
        self.sync_before: dict[str, int] = {}
        self._window_start = 0  # chunks already covered by a previous metrics row
        # Chunks that ended in an env fault, by kind (pipeline/envs/faults.py); the last one's
        # words; chunks in a row that ended so (the loop stops the run past a bound).
        self.env_errors = dict.fromkeys(FAULT_KINDS, 0)
        self.last_env_error: str | None = None
        self.faults_in_a_row = 0

    def record(self, arrival: Arrival) -> None:
        h = arrival.header
        self.env_steps += int(h.get("env_steps", arrival.transitions))
        fault = h.get("env_error")
        self.faults_in_a_row = self.faults_in_a_row + 1 if fault else 0
        if fault:
            self.env_errors[fault["kind"]] += 1
            self.last_env_error = f"{fault['kind']}: {fault['error']}"
            if not arrival.transitions:  # a header alone: no behaviour policy to lag
                return
        self.lag_versions.append(arrival.lag_versions)
        self.lag_updates.append(arrival.lag_updates)
        if isinstance(h.get("divergence"), float):
            self.divergences.append((h["divergence"], len(self.lag_versions) - 1))
        if isinstance(h.get("sync"), dict):
            self.worker_sync[h["worker"]] = h["sync"]
        self.episode_returns.extend(float(r) for r, _ in h.get("episodes", []))

    def sync_totals(self) -> dict[str, int]:
        """The workers' latest cumulative sync counters, summed over workers."""
        totals = dict(self.sync_before)
        for counters in self.worker_sync.values():
            for k, v in counters.items():
                totals[k] = totals.get(k, 0) + int(v)
        return totals

    def lag_stats(self, since: int = 0) -> dict[str, float | None]:
        """Policy lag at ingest (versions and gradient steps) and divergence at sync checks,
        over the chunks that arrived after the first `since`."""
        lags = np.asarray(self.lag_versions[since:] or [0])
        lag_updates = np.asarray(self.lag_updates[since:] or [0])
        divergences = [d for d, i in self.divergences if i >= since]
        return {
            "lag_versions_mean": float(lags.mean()),
            "lag_versions_max": int(lags.max()),
            "lag_updates_mean": float(lag_updates.mean()),
            "lag_updates_p95": float(np.percentile(lag_updates, 95)),
            "lag_updates_max": int(lag_updates.max()),
            "divergence_mean": float(np.mean(divergences)) if divergences else None,
        }

    def window_lag_stats(self) -> dict[str, float | None]:
        """`lag_stats` over the chunks that arrived since the previous call (one metrics row)."""
        stats = self.lag_stats(self._window_start)
        self._window_start = len(self.lag_versions)
        return stats

    def recent_return(self, episodes: int = 20) -> float | None:
        """Mean return of the last `episodes` training episodes the workers finished."""
        tail = self.episode_returns[-episodes:]
        return float(np.mean(tail)) if tail else None

    def save(self) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        """Arrays and JSON-able counters a checkpoint keeps."""
        arrays = {
            "lag_versions": np.asarray(self.lag_versions, np.int64),
            "lag_updates": np.asarray(self.lag_updates, np.int64),
            "divergence": np.asarray([d for d, _ in self.divergences], np.float64),
            "divergence_chunk": np.asarray([i for _, i in self.divergences], np.int64),
            "episode_returns": np.asarray(self.episode_returns, np.float64),
        }
        counters = {"env_steps": self.env_steps, "broker_recoveries": self.broker_recoveries,
                    "sync_totals": self.sync_totals(), "env_errors": self.env_errors,
                    "last_env_error": self.last_env_error}  # fmt: skip
        return arrays, counters

    def restore(self, arrays: Mapping[str, np.ndarray], counters: Mapping[str, Any]) -> None:
        """Take back what `save` returned (a resumed learner)."""
        self.lag_versions = arrays["lag_versions"].tolist()
        self.lag_updates = arrays["lag_updates"].tolist()
        self.divergences = list(
            zip(arrays["divergence"].tolist(), arrays["divergence_chunk"].tolist(), strict=True)
        )
        self.episode_returns = arrays["episode_returns"].tolist()
        self.env_steps, self.broker_recoveries = (
            counters["env_steps"],
            counters["broker_recoveries"],
        )
        self.sync_before, self.worker_sync = dict(counters["sync_totals"]), {}
        self.env_errors |= counters.get("env_errors", {})  # absent before env faults were counted
        self.last_env_error = counters.get("last_env_error")
        self._window_start = len(self.lag_versions)

    def summary(self) -> dict[str, Any]:
        return {
            "sync_total": self.sync_totals(),
            "lag": self.lag_stats(),
            "sync_per_worker": self.worker_sync,
            "env_errors": self.env_errors,
            "last_env_error": self.last_env_error,
        }
