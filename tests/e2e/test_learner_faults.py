"""Learner faults: killed with SIGKILL (nothing of its stack survives it, and `--resume` finishes
its run), and an ingest that keeps failing (retried, then the run ends with one line)."""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import time
import uuid
from pathlib import Path

import psutil
import pytest
import redis

from clusterenv.learner.config import CheckpointConfig
from clusterenv.learner.persistence.checkpoint import Checkpoints
from clusterenv.learner.persistence.resume import published_version
from clusterenv.learner.run.metrics import read_metrics
from clusterenv.learner.tools.cli import main
from clusterenv.pipeline.keys import RunKeys
from tests.e2e.cli_runs import (
    Tree,
    assert_no_survivors,
    only_run_dir,
    run_with_broker_fault,
    start_cli,
    wait_for_rows,
    wait_watching,
)

BUDGET = 12_000


def chunks_after(log: Path, offset: int) -> list[dict]:
    """Summaries of the collect_chunk tasks the workers finished after byte `offset` of their log."""
    text = log.read_bytes()[offset:].decode(errors="replace")
    found = re.findall(r"clusterenv\.collect_chunk\[[^\]]*\] succeeded in [^:]*: (\{.*\})", text)
    return [s for s in map(ast.literal_eval, found) if "steps" in s]  # not the skipped ones


def in_groups(pgids: set[int]) -> list[int]:
    """Live processes of the given process groups."""
    found = []
    for proc in psutil.process_iter():
        try:
            if os.getpgid(proc.pid) in pgids and proc.status() != psutil.STATUS_ZOMBIE:
                found.append(proc.pid)
        except (ProcessLookupError, psutil.Error):
            continue
    return found


def wait_for_checkpoint(run_dir: Path, min_env_steps: int, proc: subprocess.Popen) -> None:
    store = Checkpoints(run_dir, CheckpointConfig())
    deadline = time.monotonic() + 180
    while True:
        assert proc.poll() is None, proc.stderr.read()
        assert time.monotonic() < deadline, "no checkpoint was written"
        try:
            if store.newest()[2]["accounting"]["env_steps"] >= min_env_steps:
                return
        except Exception:  # none yet, or pruned while it was read: look again
            pass
        time.sleep(0.2)


@pytest.mark.slow
def test_a_sigkilled_learner_leaves_nothing_behind_and_resume_finishes_its_run(tmp_path):
    mark = uuid.uuid4().hex
    proc = start_cli(
        ["train", "--total-steps", str(BUDGET), "--target-return", "1e9", "--eval-every", "2000",
         "--workers", "2", "--checkpoint-every-updates", "200", "--checkpoints-kept", "2",
         "--run-dir", str(tmp_path)], mark,
    )  # fmt: skip
    tree = Tree(proc)
    try:
        wait_for_rows(tmp_path, 2, proc, 240)
        run_dir = only_run_dir(tmp_path)
        wait_for_checkpoint(run_dir, 4000, proc)
        tree.look()
        assert "valkey-server" in tree.names() and len(tree.alive()) >= 3  # server, two workers
        groups = {os.getpgid(pid) for pid in tree.alive()}  # each child leads its own group
        assert os.getpgid(0) not in groups
    finally:
        proc.kill()  # SIGKILL: no handler, no cleanup of its own
        proc.wait()
    # The server and the workers die with it (their parent-death signal), within seconds.
    assert_no_survivors(mark, tree, timeout_s=5.0)
    assert not in_groups(groups)  # nor anything they had started meanwhile
    assert not (run_dir / "summary.json").exists()
    _, _, ckpt = Checkpoints(run_dir, CheckpointConfig()).newest()
    steps, updates = ckpt["accounting"]["env_steps"], ckpt["learner"]["updates"]
    assert steps < BUDGET, "the run ended before it was killed: nothing to resume"
    rows_before = read_metrics(run_dir / "metrics.jsonl")
    newest_before = published_version(run_dir)
    assert newest_before >= max(r["learner/policy_version"] for r in rows_before)
    log = run_dir / "workers.log"
    offset = log.stat().st_size

    mark = uuid.uuid4().hex
    proc = start_cli(["train", "--resume", str(run_dir)], mark)
    tree = Tree(proc)
    try:
        err = wait_watching(proc, tree, 300)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    assert f"({steps} env steps, {updates} updates" in err, err
    assert_no_survivors(mark, tree)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["run_id"] == f"{run_dir.name}.r1" and summary["resumed_from"]
    assert summary["env_steps"] >= BUDGET and summary["updates"] > updates
    # Versions never repeat one the killed learner published (workers may have cached it).
    rows = read_metrics(run_dir / "metrics.jsonl")
    after = rows[len(rows_before) :]
    assert after and all(r["eval/policy_version"] > newest_before for r in after)
    assert all(r["env_steps"] >= steps for r in after)  # an eval lost in flight: at `steps`
    # Env steps went on from the checkpoint's count: the resumed learner collected what was left
    # of the budget (plus at most a few chunks in flight), not the whole budget again.
    chunks = chunks_after(log, offset)
    collected = sum(c["steps"] for c in chunks)
    assert steps + collected >= summary["env_steps"]
    assert collected <= BUDGET - steps + 8 * 256, (collected, steps)
    assert min(c["chunk"] for c in chunks) >= ckpt["dispatch"]["next_chunk"]  # ids go on too
    assert len(list((run_dir / "checkpoints").iterdir())) == 2  # --checkpoints-kept


def test_resume_refuses_a_changed_setting_and_a_directory_without_checkpoints(tmp_path, capsys):
    (tmp_path / "config.json").write_text(json.dumps({"env": "CartPole-v1", "seed": 3}))
    cases = [
        ([str(tmp_path), "--lr", "0.1"], "--lr 0.1 contradicts the run's 0.0023"),
        ([str(tmp_path), "--seed", "4"], "--seed 4 contradicts the run's 3"),
        ([str(tmp_path), "--total-steps", "5"], "no usable checkpoint in"),  # a flag it may change
        ([str(tmp_path / "nowhere")], "is not a run directory"),
    ]
    for args, message in cases:
        assert main(["train", "--resume", *args]) == 2
        err = capsys.readouterr().err
        assert message in err and len(err.strip().splitlines()) == 1, err


@pytest.mark.slow
def test_an_ingest_that_keeps_failing_is_retried_then_ends_the_run_with_one_line(tmp_path):
    def break_the_stream(server) -> None:
        # The run's stream becomes a string: every read of it fails (WRONGTYPE), and no client
        # retry or reconnect can mend that; only the ingest thread's own retries apply.
        keys = RunKeys(only_run_dir(tmp_path).name)
        with redis.Redis.from_url(server.url) as client:
            pipe = client.pipeline(transaction=True)
            pipe.delete(keys.stream)
            pipe.set(keys.stream, "not a stream")
            pipe.execute()

    mark = uuid.uuid4().hex
    t0 = time.monotonic()
    proc, tree, err = run_with_broker_fault(
        tmp_path, ["--total-steps", "1000000", "--eval-every", "1000"], break_the_stream, mark
    )
    assert proc.returncode == 1, err
    lines = [line for line in err.splitlines() if "run failed" in line]
    assert len(lines) == 1 and "ingest failed: ResponseError: WRONGTYPE" in lines[0], err
    assert "Traceback" not in err
    assert err.count("retry ") == 6  # the thread's retries, logged, before it gave up
    summary = json.loads((only_run_dir(tmp_path) / "summary.json").read_text())
    assert "ingest failed" in summary["failed"] and summary["ingest_retries"] == 6
    assert time.monotonic() - t0 < 240
    assert_no_survivors(mark, tree)
