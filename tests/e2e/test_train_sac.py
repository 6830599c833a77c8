"""`clusterenv train --algo sac` as a user runs it: SAC over the workers solves Pendulum-v1."""

from __future__ import annotations

import json
import subprocess

import pytest

from clusterenv.learner.run.metrics import read_metrics
from clusterenv.pipeline.codec import decode_weights
from tests.e2e.cli_runs import CLI, train_to_end


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize("sync", [None, "aps:0.01:value"])
def test_sac_solves_pendulum_end_to_end(tmp_path, sync):
    """RL-Zoo's SAC reaches -176 on Pendulum-v1 at 20k env steps; the preset (its settings) runs
    to a greedy eval >= -200 within 40k here. Workers sample the actor and send bare actions.
    With `aps:0.01:value` they also read the critics' model of Q in each probe and fetch when
    their actions are worth 1 % of the values apart."""
    run_dir, summary, err = train_to_end(
        ["train", "--algo", "sac", "--env", "Pendulum-v1", "--total-steps", "40000",
         "--target-return", "-200", "--workers", "2", *(["--sync", sync] if sync else [])],
        tmp_path, 840,
    )  # fmt: skip
    assert summary["algo"] == "sac" and summary["ingest"]["rejected"] == 0
    assert summary["solved"], (summary["env_steps"], err[-2000:])
    rows = read_metrics(run_dir / "metrics.jsonl")
    assert all(
        "losses/critic_loss" in r and "learner/alpha" in r for r in rows if r["learner/updates"]
    )
    if sync is not None:
        sync_total = summary["sync_total"]
        assert sync_total["probe_fetches"] > 0, sync_total
        assert sync_total.get("probes_rejected", 0) == 0, sync_total
        return
    out = subprocess.run(CLI + ["eval", str(run_dir), "--episodes", "2"], capture_output=True,
                         text=True, timeout=120)  # fmt: skip
    assert out.returncode == 0 and "over 2 episodes" in out.stdout, out.stderr


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_gsde_runs_through_the_workers_and_its_actor_plays_back(tmp_path):
    """MountainCarContinuous-v0's preset (RL-Zoo's: gSDE, α fixed at 0.1) over two workers: the
    chunks come back acted with each env's state-dependent noise (a worker acting otherwise, or
    failing to, would leave the budget unspent), the KL probes read the gSDE actor's outputs,
    and the published actor, with its log σ, plays back under `clusterenv eval`."""
    run_dir, summary, err = train_to_end(
        ["train", "--algo", "sac", "--env", "MountainCarContinuous-v0", "--total-steps", "4096",
         "--eval-every", "2048", "--eval-episodes", "1", "--workers", "2"],
        tmp_path, 540,
    )  # fmt: skip
    assert summary["env_steps"] >= 4096 and summary["updates"] > 0, err[-2000:]
    assert summary["ingest"]["rejected"] == 0
    sync_total = summary["sync_total"]
    assert sync_total["weight_fetches"] >= 2 and sync_total["probe_fetches"] > 0, sync_total
    assert sync_total.get("probes_rejected", 0) == 0, sync_total
    config = json.loads((run_dir / "config.json").read_text())
    assert config["agent"]["gsde"] and not config["agent"]["learn_alpha"]
    final = decode_weights((run_dir / "final.safetensors").read_bytes())
    assert final["learner.actor.sde.log_std"].shape == (64, 1)
    rows = read_metrics(run_dir / "metrics.jsonl")
    assert all(r["learner/alpha"] == pytest.approx(0.1) for r in rows if r["learner/updates"])
    out = subprocess.run(CLI + ["eval", str(run_dir), "--episodes", "1"], capture_output=True,
                         text=True, timeout=120)  # fmt: skip
    assert out.returncode == 0 and "over 1 episodes" in out.stdout, out.stderr
