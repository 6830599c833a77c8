"""bench/presets.py's summary of an ablation: misses count as never, variants against the preset."""

from __future__ import annotations

import math

from bench.presets import summarise


def _run(system: str, seed: int, first_hit: int | None, end: float, mean: float) -> dict:
    return {"env": "LunarLander-v3", "system": system, "seed": seed, "bar": 200.0,
            "budget": 100_000, "first_hit_steps": first_hit, "end_eval": end, "mean_eval": mean,
            "best_eval": max(end, 200.0 if first_hit else end)}  # fmt: skip


def test_a_variant_is_compared_to_the_preset_and_a_missed_bar_counts_as_never():
    runs = [
        *(_run("clusterenv", s, hit, end, 0.0) for s, hit, end in
          [(1, 40_000, 150.0), (2, 60_000, 210.0), (3, None, 100.0)]),
        *(_run("clusterenv --n-step 3", s, hit, 220.0, 100.0) for s, hit in
          [(1, 20_000), (2, 30_000), (3, 25_000)]),
    ]  # fmt: skip
    preset, variant = summarise(runs)
    assert preset["reached_bar"] == "2/3"
    assert preset["median_first_hit"] == 60_000
    assert preset["first_hit_ci"][1] == math.inf  # one miss in three: the seeds cannot bound it
    assert preset["first_hit_vs_first_system"] is None
    assert preset["above_bar_at_end"] == "1/3"
    assert variant["above_bar_at_end"] == "3/3"
    assert variant["mean_eval"] == 100.0
    ratio, lo, hi = variant["first_hit_vs_first_system"]
    assert ratio == 25_000 / 60_000
    assert lo <= ratio <= hi
