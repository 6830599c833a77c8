"""`clusterenv train --algo ppo` as a user runs it: PPO on chunks solves CartPole end to end, and
trains a squashed Gaussian on Box actions."""

from __future__ import annotations

import json
import subprocess

import pytest

from clusterenv.learner.run.metrics import read_metrics
from tests.e2e.cli_runs import CLI, train_to_end


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_ppo_solves_cartpole_with_the_default_aps_rule(tmp_path):
    # CleanRL's PPO reaches CartPole's 475 in about 50k-100k env steps; seeds 1-5 here: 32k-88k.
    run_dir, summary, err = train_to_end(
        ["train", "--algo", "ppo", "--env", "CartPole-v1", "--total-steps", "200000",
         "--eval-every", "4000", "--workers", "2"], tmp_path, 840,
    )  # fmt: skip
    assert summary["algo"] == "ppo"
    assert summary["solved"], (summary["env_steps"], err[-2000:])
    assert summary["ingest"]["rejected"] == 0  # every chunk carried its behaviour log-probs
    # One version per PPO update; the workers' APS rule measured the policies' KL on probes.
    assert summary["policy_versions"] == summary["updates"] + 1
    assert summary["sync_total"]["probe_fetches"] > 0
    assert summary["lag"]["divergence_mean"] is not None
    # PPO's "*" preset (aps:0.02, max lag 32): the version guard at half the max lag keeps the
    # workers' policies young enough to train on; a version takes 2048 env steps, a chunk 256.
    assert json.loads((run_dir / "config.json").read_text())["weights"]["sync"] == "aps:0.02"
    assert summary["lag"]["lag_versions_max"] <= 32  # guard 16 at chunk start, max lag 32
    assert "pipeline/stale_chunks_dropped" in summary["learner"]  # counted, if any
    rows = read_metrics(run_dir / "metrics.jsonl")
    assert all("losses/approx_kl" in r and "losses/td_loss" not in r for r in rows)
    # The final checkpoint's policy plays back greedily on this machine.
    out = subprocess.run(CLI + ["eval", str(run_dir), "--episodes", "2"], capture_output=True,
                         text=True, timeout=120)  # fmt: skip
    assert out.returncode == 0 and "over 2 episodes" in out.stdout, out.stderr


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_ppo_trains_a_squashed_gaussian_on_box_actions_end_to_end(tmp_path):
    """`--algo ppo --env Pendulum-v1`: workers sample a tanh-squashed Gaussian scaled to [-2, 2],
    every chunk (float32 actions, behaviour log-probs, pre-squash samples) is accepted, APS
    measures the Gaussians' KL on probes, evaluation and `clusterenv eval` act with the mean."""
    run_dir, summary, _ = train_to_end(
        ["train", "--algo", "ppo", "--env", "Pendulum-v1", "--total-steps", "16384",
         "--eval-every", "8192", "--workers", "2"], tmp_path, 540,
    )  # fmt: skip
    assert summary["algo"] == "ppo" and summary["env_steps"] >= 16384
    assert summary["ingest"]["rejected"] == 0
    assert summary["sync_total"]["probe_fetches"] > 0
    assert summary["lag"]["divergence_mean"] is not None
    rows = read_metrics(run_dir / "metrics.jsonl")
    returns = [r["eval/return_mean"] for r in rows if "eval/return_mean" in r]
    # Pendulum's returns over 200 steps lie in about [-1,700, 0].
    assert returns and all(-2000.0 < r <= 0.0 for r in returns), returns
    out = subprocess.run(CLI + ["eval", str(run_dir), "--episodes", "2"], capture_output=True,
                         text=True, timeout=120)  # fmt: skip
    assert out.returncode == 0 and "over 2 episodes" in out.stdout, out.stderr


@pytest.mark.parametrize(
    "args,message",
    [
        (["--sync", "aps:0.01:value"], "the value measure needs Q-values (DQN, SAC)"),
        (
            ["--env", "Pendulum-v1", "--sync", "aps:0.01:tv"],
            # the hint lists only what PPO's Gaussian can take (not SAC's value measure)
            "divergence 'tv' does not apply to squashed_gaussian policies; choose kl (",
        ),
        (["--max-policy-lag", "-1"], "--max-policy-lag must be >= 0"),
        (["--hidden", "64,x"], "--hidden must be positive integers"),
        (["--batch-steps", "2", "--num-minibatches", "4"], "--batch-steps must be at least"),
    ],
)
def test_bad_ppo_flags_give_one_line_errors(tmp_path, args, message):
    out = subprocess.run(CLI + ["train", "--algo", "ppo", "--run-dir", str(tmp_path), *args],
                         capture_output=True, text=True, timeout=60)  # fmt: skip
    assert out.returncode == 2, out.stderr
    assert message in out.stderr and "Traceback" not in out.stderr
    assert list(tmp_path.iterdir()) == []
