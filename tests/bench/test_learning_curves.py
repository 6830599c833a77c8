"""bench/learning_curves.py: run files by env id, and the comparison of the curves with the peer's."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.learning_curves import main, run_path, summarize


def _run(seed: int, returns: list[float], seconds_per_eval: float) -> dict:
    return {"seed": seed, "evals": [[10_000 * (i + 1), seconds_per_eval * (i + 1), r]
                                    for i, r in enumerate(returns)]}  # fmt: skip


def test_an_env_id_with_a_family_names_one_flat_file_per_system_and_seed():
    path = run_path(Path("runs"), "SB3 SAC", "MinAtar/Breakout-v1", 3)
    assert path == Path("runs/SB3_SAC__MinAtar_Breakout-v1__s3.json")


def test_the_curves_are_compared_at_each_eval_and_at_the_budget():
    peer = [_run(1, [0.0, 10.0, 20.0], 100.0), _run(2, [2.0, 14.0, 30.0], 100.0)]
    ours = [_run(1, [1.0, 5.0, 26.0], 40.0), _run(2, [3.0, 7.0, 24.0], 40.0)]
    s = summarize({"clusterenv": ours, "SB3 SAC": peer}, "SB3 SAC")
    assert s["curves"]["clusterenv"][1] == {"env_steps": 20_000, "wall_s": 80.0, "mean": 6.0,
                                            "min": 5.0, "max": 7.0}  # fmt: skip
    # At 20k, 6.0 is below the peer's lowest seed (10.0); at 10k and at the budget it is not.
    assert s["evals_within_or_above_peer_range"] == 2
    assert s["final_within_or_above_peer_range"] is True
    assert s["peer_final_mean"] == 25.0
    # Our seed 1 reaches 25 at its third eval (120 s), seed 2 never does: the median of 120 and
    # inf is inf, so no ratio is claimed.
    assert s["wall_to_peer_final_s"]["clusterenv"] == float("inf")
    assert s["wall_ratio"] is None


def test_a_peer_of_another_algorithm_is_refused_by_name(capsys):
    with pytest.raises(SystemExit):
        main(["--algo", "sac", "--envs", "Pendulum-v1", "--systems", "clusterenv,SB3 DQN"])
    assert "unknown ['SB3 DQN'] with --algo sac" in capsys.readouterr().err
