"""The CleanRL-style examples run end to end on small budgets (remote envs on real workers)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from clusterenv.pipeline.cluster.embedded import LocalWorkers

ROOT = Path(__file__).resolve().parents[2]

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]


def run_example(name: str, *flags: str) -> str:
    proc = subprocess.run(
        [sys.executable, str(ROOT / "examples" / name), *flags],
        cwd=ROOT, capture_output=True, text=True, timeout=200,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    assert "charts/episodic_return=" in proc.stdout
    return proc.stdout


def test_dqn_example_on_attached_workers(redis_url: str, workers: LocalWorkers) -> None:
    out = run_example(
        "dqn_cartpole.py", "--redis-url", redis_url, "--num-envs", "2",
        "--total-timesteps", "3000", "--learning-starts", "1000",
    )  # fmt: skip
    assert "losses/td_loss=" in out


def test_ppo_example_with_embedded_stack() -> None:
    out = run_example("ppo_cartpole.py", "--total-timesteps", "1024", "--num-steps", "64")
    assert "losses/policy_loss=" in out
