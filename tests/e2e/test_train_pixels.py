"""`clusterenv train` on pixel envs as a user runs it: MinAtar's uint8 frames and Atari's stacks
of 84 x 84 frames (each frame once on the wire and in replay) through real workers, end to end."""

from __future__ import annotations

import json
import uuid

import pytest

from clusterenv.learner.run.metrics import read_metrics
from tests.e2e.cli_runs import Tree, assert_no_survivors, only_run_dir, start_cli, wait_watching


def train(tmp_path, env: str, *flags: str) -> tuple[dict, list[dict]]:
    mark = uuid.uuid4().hex
    proc = start_cli(["train", "--env", env, "--workers", "1", "--eval-episodes", "1",
                      "--run-dir", str(tmp_path), *flags], mark)  # fmt: skip
    tree = Tree(proc)
    err = wait_watching(proc, tree, 400)
    assert proc.returncode == 0, err
    assert_no_survivors(mark, tree)
    run_dir = only_run_dir(tmp_path)
    return json.loads((run_dir / "summary.json").read_text()), read_metrics(
        run_dir / "metrics.jsonl"
    )


@pytest.mark.slow
@pytest.mark.timeout(450)
def test_a_minatar_game_trains_end_to_end(tmp_path):
    summary, rows = train(tmp_path, "MinAtar/Breakout-v1", "--total-steps", "6000",
                          "--eval-every", "2000")  # fmt: skip
    assert summary["env_steps"] >= 6000 and summary["updates"] > 0
    assert summary["ingest"]["rejected"] == 0 and summary["lost_chunks"] == 0
    # Evaluations every 2,000 env steps, one at a time (one may still run when the next is due),
    # and the last one at the end of the budget.
    steps = [r["env_steps"] for r in rows]
    assert len(steps) >= 2 and steps == sorted(steps) and steps[-1] == summary["env_steps"]
    assert all(r["eval/return_mean"] >= 0 for r in rows)  # Breakout's scores: bricks hit


@pytest.mark.slow
@pytest.mark.timeout(450)
def test_an_atari_game_trains_end_to_end_on_stacked_frames(tmp_path):
    summary, rows = train(
        tmp_path, "ALE/Pong-v5", "--total-steps", "4096", "--eval-every", "2048",
        "--buffer-size", "5000", "--learning-starts", "500", "--hidden", "32",
        "--samples-per-insert", "4", "--eval-timeout-s", "200",
    )  # fmt: skip
    assert summary["env_steps"] >= 4096 and summary["updates"] > 0
    # The frames chunks carry rebuild every transition the learner took (none refused).
    # RL-Zoo's Atari preset collects in chunks of 8 x 128: four of them spend the budget.
    assert summary["ingest"]["rejected"] == 0 and summary["ingest"]["chunks"] == 4
    # Evaluation plays whole games, unclipped: Pong's score is -21..21, a lost game -21.
    assert rows and all(-21 <= r["eval/return_mean"] <= 21 for r in rows)
    assert summary["learner"]["learner/replay_size"] >= 4000
