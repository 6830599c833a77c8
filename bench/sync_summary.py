"""The sync grid's summary per env and rule: medians over seeds with bootstrap 95% intervals, the
ratio of bytes to solve against on-change, the Pareto front and the front within the intervals.

Used by bench/sync_policies.py; tests/bench/test_sync_summary.py checks the statistics.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from bench.common import median

BOOTSTRAP_RESAMPLES = 4000


def _resamples(rng: np.random.Generator, values: list[float]) -> np.ndarray:
    """BOOTSTRAP_RESAMPLES rows, each `values` drawn with replacement."""
    data = np.asarray(values, dtype=np.float64)
    return data[rng.integers(0, len(data), size=(BOOTSTRAP_RESAMPLES, len(data)))]


def _percentiles(stats: np.ndarray, level: float) -> tuple[float, float]:
    """The central `level` interval of a bootstrap distribution."""
    stats = np.sort(stats)
    lo = stats[int(np.floor((1 - level) / 2 * (len(stats) - 1)))]
    hi = stats[int(np.ceil((1 + level) / 2 * (len(stats) - 1)))]
    return float(lo), float(hi)


def bootstrap_ci(
    values: list[float], stat: Callable[[np.ndarray], Any], seed: int = 0, level: float = 0.95
) -> tuple[float, float]:
    """Percentile bootstrap interval of `stat` over `values` (resampled with replacement).

    +inf (not solved) stays in: a median interval that reaches +inf says the seeds do not resolve
    whether the rule solves at all."""
    rng = np.random.default_rng(seed)
    return _percentiles(np.array([stat(row) for row in _resamples(rng, values)]), level)


def bootstrap_ratio(
    num: list[float], den: list[float], seed: int = 0, level: float = 0.95
) -> tuple[float, float, float]:
    """median(num) / median(den), with a percentile bootstrap interval from resampling each
    sample on its own. An unsolved run is +inf: a ratio with +inf below is 0, above +inf."""
    rng = np.random.default_rng(seed)
    a, b = _resamples(rng, num), _resamples(rng, den)
    with np.errstate(invalid="ignore", divide="ignore"):
        ratios = np.median(a, axis=1) / np.median(b, axis=1)
        point = float(np.median(num) / np.median(den))
    return (point, *_percentiles(ratios, level))


def summarise(runs: list[dict[str, Any]], env: str) -> list[dict[str, Any]]:
    out = []
    to_solve_by_rule: dict[str, list[float]] = {}
    for rule in dict.fromkeys(r["rule"] for r in runs if r["env"] == env):
        mine = [r for r in runs if r["env"] == env and r["rule"] == rule]
        steps = [r["steps_to_solve"] if r["steps_to_solve"] is not None else math.inf for r in mine]
        finite = [s for s in steps if s != math.inf]
        aucs = [r["auc"] for r in mine]
        # Runs from before the figure was kept read as NaN, not as "never solved"
        to_solve = [
            math.nan if "bytes_to_solve_per_worker" not in r
            else math.inf if r["bytes_to_solve_per_worker"] is None
            else r["bytes_to_solve_per_worker"] / 1e6
            for r in mine
        ]  # fmt: skip
        to_solve_by_rule[rule] = to_solve
        steps_lo, steps_hi = bootstrap_ci(steps, np.median)
        mb_lo, mb_hi = bootstrap_ci(to_solve, np.median)
        auc_lo, auc_hi = bootstrap_ci(aucs, np.mean)
        out.append({
            "rule": rule,
            "seeds": len(mine),
            "solved": f"{len(finite)}/{len(mine)}",
            "median_steps": median(steps),
            "steps_ci_low": steps_lo,
            "steps_ci_high": steps_hi,
            "MB_to_solve_per_worker": median(to_solve),
            "MB_to_solve_ci_low": mb_lo,
            "MB_to_solve_ci_high": mb_hi,
            "mean_eval_auc": float(np.mean(aucs)),
            "auc_ci_low": auc_lo,
            "auc_ci_high": auc_hi,
            "weight_MB_per_worker": median([r["weight_bytes_per_worker"] for r in mine]) / 1e6,
            "fetches_per_worker": median([r["weight_fetches_per_worker"] for r in mine]),
            "probe_MB_per_worker": median([r["probe_bytes_per_worker"] for r in mine]) / 1e6,
            "lag_updates_mean": median([r["lag_lag_updates_mean"] for r in mine]),
            "lag_updates_p95": median([r["lag_lag_updates_p95"] for r in mine]),
            "stale_rows_dropped": median([r.get("stale_rows_dropped") or 0 for r in mine]),
        })  # fmt: skip
    base = to_solve_by_rule.get("on-change")
    for row in out:
        # "At equal return" read as the solved level: on-change's median bytes to it over this
        # rule's, and how far resampling the seeds of both moves that ratio
        fewer = (
            bootstrap_ratio(base, to_solve_by_rule[row["rule"]])
            if base
            else (math.nan, math.nan, math.nan)
        )
        row["x_fewer_MB_to_solve"], row["x_fewer_ci_low"], row["x_fewer_ci_high"] = fewer
    front, resolved = pareto(out), not_resolvably_dominated(out)
    for row in out:
        row["pareto"] = "yes" if row["rule"] in front else ""
        row["front_within_ci"] = "yes" if row["rule"] in resolved else ""
    return out


def total_mb(row: dict[str, Any]) -> float:
    return row["weight_MB_per_worker"] + row["probe_MB_per_worker"]


def pareto(rows: list[dict[str, Any]]) -> set[str]:
    """Rules no other rule beats on both total bytes (weights + probes) and median steps."""

    def cost(r):
        return (total_mb(r), r["median_steps"])

    front = set()
    for r in rows:
        b, s = cost(r)
        dominated = any(
            (cost(o)[0] <= b and cost(o)[1] <= s) and cost(o) != (b, s) for o in rows if o is not r
        )
        if not dominated:
            front.add(r["rule"])
    return front


def not_resolvably_dominated(rows: list[dict[str, Any]]) -> set[str]:
    """Rules for which no rule moving no more bytes has a steps CI wholly below theirs."""
    return {
        r["rule"]
        for r in rows
        if not any(
            o is not r and total_mb(o) <= total_mb(r) and o["steps_ci_high"] < r["steps_ci_low"]
            for o in rows
        )
    }
