"""The PPO sync grid's statistics: bootstrap intervals and the 'on the front within its CI' test."""

import math

import numpy as np

from bench.sync_policies import bytes_to_solve
from bench.sync_summary import bootstrap_ci, bootstrap_ratio, not_resolvably_dominated


def test_bootstrap_interval_brackets_the_median_and_keeps_unsolved_seeds() -> None:
    lo, hi = bootstrap_ci([10.0, 20.0, 30.0, 40.0, 50.0], np.median)
    assert 10.0 <= lo <= 30.0 <= hi <= 50.0
    assert bootstrap_ci([7.0] * 5, np.median) == (7.0, 7.0)
    # two of five unsolved: resamples with a majority unsolved exist, so the interval reaches +inf
    _, hi = bootstrap_ci([10.0, 20.0, 30.0, math.inf, math.inf], np.median)
    assert hi == math.inf


def row(rule: str, mb: float, lo: float, hi: float) -> dict:
    return {"rule": rule, "weight_MB_per_worker": mb, "probe_MB_per_worker": 0.0,
            "steps_ci_low": lo, "steps_ci_high": hi}  # fmt: skip


def test_a_rule_is_off_the_front_only_when_a_cheaper_rule_is_resolvably_faster() -> None:
    rows = [
        row("cheap-fast", 1.0, 10, 20),
        row("dear-slow", 5.0, 30, 40),  # cheap-fast's interval lies wholly below: dominated
        row("dear-overlap", 5.0, 15, 40),  # intervals overlap: not resolved
        row("cheapest-slow", 0.5, 50, 60),  # nothing moves fewer bytes
    ]
    assert not_resolvably_dominated(rows) == {"cheap-fast", "dear-overlap", "cheapest-slow"}


def test_bytes_to_solve_are_the_counters_at_the_first_eval_at_the_level() -> None:
    rows = [
        {"eval/return_mean": 150.0, "pipeline/weight_bytes": 100, "pipeline/probe_bytes": 10},
        {"eval/return_mean": 201.0, "pipeline/weight_bytes": 300, "pipeline/probe_bytes": 20},
        {"eval/return_mean": 250.0, "pipeline/weight_bytes": 900, "pipeline/probe_bytes": 30},
    ]
    assert bytes_to_solve(rows, 200.0) == 320.0
    assert bytes_to_solve(rows[:1] + [{"eval/return_mean": 200.0}], 200.0) == 0.0


def test_ratio_of_medians_with_its_interval() -> None:
    point, lo, hi = bootstrap_ratio([10.0, 10.0, 10.0], [2.0, 2.0, 2.0])
    assert (point, lo, hi) == (5.0, 5.0, 5.0)
    point, lo, hi = bootstrap_ratio([8.0, 10.0, 12.0], [1.0, 2.0, 4.0])
    assert lo < point == 5.0 < hi
    # the rule never reached the level in most resamples: the ratio's low end is 0
    point, lo, _ = bootstrap_ratio([10.0, 10.0, 10.0], [2.0, math.inf, math.inf])
    assert point == 0.0 and lo == 0.0
