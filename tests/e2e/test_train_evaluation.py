"""`clusterenv train`'s greedy evaluations, on the workers: never in the learner, never stalling
collection, given up when their worker is lost or they outlast their timeout."""

from __future__ import annotations

import json
import os
import signal
import time
import uuid
from pathlib import Path

import pytest

from clusterenv.learner.run.metrics import read_metrics
from tests.e2e.cli_runs import Tree, assert_no_survivors, only_run_dir, start_cli, wait_watching


@pytest.mark.slow
def test_evaluation_runs_on_the_workers_not_in_the_learner(tmp_path):
    steppers = tmp_path / "steppers.txt"
    proc = start_cli(
        ["train", "--env", "tests.e2e.step_recorder:StepRecorder-v0",
         "--env-kwargs", json.dumps({"log_path": str(steppers)}), "--total-steps", "3000",
         "--eval-every", "1000", "--eval-episodes", "4", "--workers", "2",
         "--status-every-s", "0.5", "--run-dir", str(tmp_path / "runs")], uuid.uuid4().hex,
    )  # fmt: skip
    _, err = proc.communicate(timeout=240)
    assert proc.returncode == 0, err
    assert "status: steps " in err and " steps/s " in err  # no terminal: periodic status lines
    rows = read_metrics(only_run_dir(tmp_path / "runs") / "metrics.jsonl")
    assert len(rows) >= 3, rows  # evaluations came back and were recorded
    for row in rows:
        assert row["eval/policy_version"] <= row["learner/policy_version"]
        assert row["eval/latency_s"] >= 0
    pids = {int(line) for line in steppers.read_text().split()}
    assert pids and proc.pid not in pids, pids  # envs were stepped, never by the learner


def slow_eval_args(
    tmp_path: Path, log: Path, eval_delay_s: float, workers: int = 2, eval_steps: int = 0
) -> list[str]:
    env_kwargs = {"log_path": str(log), "delay_s": 0.002, "eval_delay_s": eval_delay_s,
                  "eval_steps": eval_steps}  # fmt: skip
    return ["train", "--env", "tests.e2e.step_recorder:SlowEval-v0", "--env-kwargs",
            json.dumps(env_kwargs), "--chunk-steps", "8", "--eval-every", "500",
            "--eval-episodes", "2", "--target-return", "1e9", "--workers", str(workers),
            "--run-dir", str(tmp_path / "runs")]  # fmt: skip


@pytest.mark.slow
@pytest.mark.parametrize("workers", [2, 1])  # 1: the one collecting worker is never taken away
def test_chunks_keep_arriving_while_the_workers_evaluate(tmp_path, workers):
    # A chunk takes 8 envs x 8 steps x 2 ms; an evaluation at least 2 envs x 30 steps x 20 ms =
    # 1.2 s, however far training got. Four samples per insert keep the rate limiter from pacing
    # collection to the learner's updates (at the default 32, about a chunk a second on a loaded
    # 2-core machine: a second's evaluation once saw a single chunk in CI): what is counted is
    # collection alone.
    budget, chunk = 3000, 8 * 8  # env steps: the run's, and a chunk's (8 envs x --chunk-steps 8)
    args = slow_eval_args(tmp_path, tmp_path / "evals.txt", 0.02, workers=workers, eval_steps=30)
    proc = start_cli(
        [*args, "--total-steps", str(budget), "--samples-per-insert", "4"], uuid.uuid4().hex
    )
    _, err = proc.communicate(timeout=240)
    assert proc.returncode == 0, err
    rows = read_metrics(only_run_dir(tmp_path / "runs") / "metrics.jsonl")
    seen = [(r["env_steps"], r["eval/latency_s"], r["eval/chunks_meanwhile"]) for r in rows]
    assert all(r["eval/latency_s"] >= 1.2 for r in rows), seen
    # Evaluations asked for with at least two chunks left in the budget: a chunk
    # takes ~0.2 s, so 1.2 s of evaluation leaves room for both. A lone worker taken away for the
    # evaluation delivers only the chunk it was collecting when asked: 1 in every such row with
    # `--eval-workers 0`.
    due = [r for r in rows if r["env_steps"] <= budget - 2 * chunk]
    assert len(due) >= 2, seen
    assert all(r["eval/chunks_meanwhile"] >= 2 for r in due), seen


@pytest.mark.slow
def test_a_worker_lost_during_an_evaluation_does_not_hang_the_run(tmp_path):
    log, mark = tmp_path / "evals.txt", uuid.uuid4().hex
    # An evaluation takes at most 200 steps x 2 envs x 20 ms = 8 s; the timeout is far above the
    # test's own 240 s: the evaluation must be given up because its worker's heartbeat lapsed.
    args = slow_eval_args(tmp_path, log, eval_delay_s=0.02)
    proc = start_cli(
        [*args, "--total-steps", "3000", "--eval-timeout-s", "3600", "--lost-after-s", "5"], mark
    )
    tree = Tree(proc)
    deadline = time.monotonic() + 120
    while not log.exists() or not log.read_text().strip():
        assert proc.poll() is None and time.monotonic() < deadline, "no evaluation started"
        time.sleep(0.05)
    tree.look()
    victim = int(log.read_text().split()[0])  # a worker of this CLI, in an evaluation now
    assert victim in {p.pid for p in tree.seen.values()}
    os.killpg(victim, signal.SIGKILL)
    err = wait_watching(proc, tree, 240)
    assert proc.returncode == 0, err
    assert "is gone; given up" in err  # abandoned when its worker went, not at the timeout
    rows = read_metrics(only_run_dir(tmp_path / "runs") / "metrics.jsonl")
    assert rows and rows[-1]["env_steps"] >= 3000  # later evaluations came back
    assert_no_survivors(mark, tree)


@pytest.mark.slow
def test_an_evaluation_that_outlasts_its_time_limit_is_cut_off_by_its_worker(tmp_path):
    # A CartPole episode lasts at least 8 steps (whatever the actions), so an evaluation takes at
    # least 8 steps x 2 envs x 300 ms = 4.8 s; the worker cuts it off at two thirds of
    # --eval-timeout-s (2 s) and answers with the fault at once, before the learner's own
    # timeout (3 s; tests/learner/test_loop.py gives up an evaluation nobody answers).
    args = slow_eval_args(tmp_path, tmp_path / "evals.txt", eval_delay_s=0.3)
    proc = start_cli([*args, "--total-steps", "2000", "--eval-timeout-s", "3"], uuid.uuid4().hex)
    _, err = proc.communicate(timeout=240)
    assert proc.returncode == 0, err
    assert "failed: env fault in hang: cut off after its time limit of 2 s" in err, err
    assert "given up" not in err
