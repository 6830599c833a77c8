"""The run's loop end to end against the in-process roles of tests/fakes.py (no server, no
workers): dispatch, ingest, training, publishing, evaluation, the end of a run, recovery and
resume, all through the same Run that `clusterenv train` drives over Redis and Celery."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import numpy as np
import pytest

from clusterenv.learner.config import TrainConfig
from clusterenv.learner.persistence.checkpoint import Checkpoints
from clusterenv.learner.persistence.resume import Resumed
from clusterenv.learner.run.loop import Run, RunFailed
from clusterenv.pipeline.chunks.request import COLLECT_CHUNK_TASK
from clusterenv.pipeline.codec import decode_weights
from clusterenv.pipeline.evaluation.request import EVALUATE_TASK
from tests.inprocess import FakeCluster

CHUNK = 8 * 32  # the default chunk: 8 envs x 32 steps


def small(algo: str = "dqn", total_steps: int = 16 * CHUNK) -> TrainConfig:
    """CartPole's spaces, a small network, an evaluation every 4 chunks, no periodic checkpoint."""
    cfg = TrainConfig.for_algo(algo, total_steps=total_steps, status_every_s=3600.0)
    cfg.agent.hidden = "16"
    cfg.evaluation.eval_every = 4 * CHUNK
    cfg.checkpoint.checkpoint_every_s = 0.0
    if algo == "ppo":
        cfg.agent.batch_steps = 2 * CHUNK
    return cfg


def run_dir(tmp_path: Path) -> Path:
    path = tmp_path / "run"
    path.mkdir(exist_ok=True)
    return path


def test_a_run_spends_its_budget_and_records_every_evaluation(tmp_path):
    cluster = FakeCluster(processes=2, eval_return=12.0)
    run = Run.create(small(), cluster.factory, run_dir(tmp_path), "run-a")
    result = run.run()
    # Dispatch stopped at the budget exactly: 16 chunks, each accepted once.
    assert result.env_steps == 16 * CHUNK and not result.solved
    assert cluster.send.tasks[COLLECT_CHUNK_TASK] == 16
    summary = json.loads((run.run_dir / "summary.json").read_text())
    assert summary["accepted_chunk_ids"] == [[0, 15]] and summary["lost_chunks"] == 0
    # Updates ran at the samples-per-insert ratio once replay held --learning-starts rows, and
    # every `publish_every` of them became a version the workers could fetch.
    assert result.updates > 0 and cluster.weights.version == len(cluster.weights.published) - 1
    assert cluster.weights.version >= result.updates // run.agent.publish_every
    assert cluster.weights.references, "reference states were drawn from accepted observations"
    # An evaluation every 4 chunks, and one more at the end of the budget (steps 4096 itself).
    steps = [s for s, _ in result.evals]
    assert steps == [4 * CHUNK, 8 * CHUNK, 12 * CHUNK, 16 * CHUNK] and result.best_eval == 12.0
    assert cluster.send.tasks[EVALUATE_TASK] >= len(steps)
    rows = [json.loads(line) for line in (run.run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["env_steps"] for r in rows] == steps and rows[-1]["learner/updates"] > 0
    # The run's end on the broker: marked stopped, its status final; files for resume and eval.
    assert cluster.flags.stopped and cluster.status.statuses["run-a"]["state"] == "budget spent"
    # final.safetensors: the networks alone (Adam and the rest are in the periodic checkpoint).
    final = decode_weights((run.run_dir / "final.safetensors").read_bytes())
    assert {k.split(".")[1] for k in final} == {"q", "target"}
    assert Checkpoints(run.run_dir, run.cfg.checkpoint).paths()


def test_an_evaluation_at_the_target_solves_the_run_and_keeps_its_network(tmp_path):
    cluster = FakeCluster(eval_return=500.0)  # CartPole-v1's threshold is 475
    run = Run.create(small(total_steps=100 * CHUNK), cluster.factory, run_dir(tmp_path), "run-a")
    result = run.run()
    assert result.solved and result.evals == [(4 * CHUNK, 500.0)]
    assert result.env_steps < 100 * CHUNK
    assert run.best.chosen["eval_mean"] == 500.0 and (run.run_dir / "best.safetensors").is_file()
    assert cluster.status.statuses["run-a"]["state"] == "solved"


def test_a_ppo_run_updates_on_whole_batches_and_publishes_every_update(tmp_path):
    cluster = FakeCluster()
    run = Run.create(small("ppo"), cluster.factory, run_dir(tmp_path), "run-a")
    result = run.run()
    assert result.env_steps == 16 * CHUNK
    # 16 chunks in batches of 2: up to 8 updates (dispatch runs a few chunks ahead of them)
    assert 4 <= result.updates <= 8
    assert cluster.weights.version == result.updates  # v0 is the untrained policy
    assert run.learner.dropped_chunks == 0  # the scripted workers act with the newest version


def test_a_broker_that_lost_the_run_gets_its_weights_again_and_the_chunks_in_flight_replaced(
    tmp_path,
):
    cluster = FakeCluster()
    run = Run.create(small(), cluster.factory, run_dir(tmp_path), "run-a")
    cluster.flags.mark_started()
    run.publish()
    run.collect()  # 4 chunks in flight (2 processes x 2 tasks)
    assert len(run.dispatcher.in_flight) == 4
    run.check_health()  # the marker is there: nothing to do
    assert run.accounting.broker_recoveries == 0
    cluster.flags.lose()
    run.recovery._checked_at -= 2.0  # looked at most once a second
    run.check_health()
    assert run.accounting.broker_recoveries == 1 and not cluster.flags.lost()
    assert run.dispatcher.lost == 4 and not run.dispatcher.in_flight
    assert cluster.weights.version == 1  # published again


def test_a_resumed_run_continues_from_its_checkpoint_under_a_new_run_id(tmp_path):
    first = FakeCluster()
    a = Run.create(small(), first.factory, run_dir(tmp_path), "run-a")
    before = a.run()
    _, tensors, state = Checkpoints(a.run_dir, a.cfg.checkpoint).newest()
    resumed = Resumed(a.run_dir / "ckpt", tensors, state, ["run-a"], first.weights.version)
    second = FakeCluster()
    b = Run.create(small(total_steps=24 * CHUNK), second.factory, a.run_dir, "run-a.r1", resumed)
    assert second.stopped_runs == ["run-a"]  # the dead learner's run is marked stopped
    after = b.run()
    assert after.env_steps == 24 * CHUNK and after.updates > before.updates
    # Versions continue above every version the first learner published; chunk ids too.
    assert min(second.weights.published) == first.weights.version + 1
    assert b.dispatcher.next_id == 24
    assert [s for s, _ in after.evals][: len(before.evals)] == [s for s, _ in before.evals]


def test_an_env_that_fails_in_every_chunk_ends_the_run_with_one_line_naming_it(tmp_path):
    cluster = FakeCluster()
    cluster.send.env_error = {"kind": "reset", "error": "SimulatedCrash: boom"}
    cfg = small()
    cfg.collection.env_faults_in_a_row = 6
    run = Run.create(cfg, cluster.factory, run_dir(tmp_path), "run-f")
    with pytest.raises(RunFailed) as failed:
        run.run()
    # Every arrival of a turn is counted before the check: 6 or a few more.
    found = re.fullmatch(r"env CartPole-v1 failed in (\d+) chunks in a row; the last: reset: "
                         r"SimulatedCrash: boom", str(failed.value))  # fmt: skip
    assert found and int(found[1]) >= 6, str(failed.value)
    summary = json.loads((run.run_dir / "summary.json").read_text())
    assert summary["failed"] == str(failed.value) and summary["env_steps"] == 0
    assert summary["env_errors"]["reset"] >= 6 and summary["lost_chunks"] == 0
    assert summary["ingest"]["rejected"] == 0 and summary["lag"]["lag_versions_max"] == 0


def test_faults_between_good_chunks_are_counted_and_the_run_goes_on(tmp_path):
    cluster = FakeCluster()
    faults = iter([True, False, True, True, False] + [False] * 100)
    send = cluster.send

    def sometimes_failing(name: str, kwargs: dict) -> None:
        if name == COLLECT_CHUNK_TASK:
            send.env_error = {"kind": "step", "error": "E: x"} if next(faults) else None
        send(name, kwargs)

    cluster.send = sometimes_failing
    cfg = small()
    cfg.collection.env_faults_in_a_row = 3  # two in a row at most here: the run goes on
    result = Run.create(cfg, cluster.factory, run_dir(tmp_path), "run-g").run()
    assert result.env_steps == 16 * CHUNK
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["env_errors"] == {"make": 0, "reset": 0, "step": 3, "hang": 0}
    assert summary["last_env_error"] == "step: E: x" and summary["failed"] is None
    rows = [
        json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    ]
    assert rows[-1]["pipeline/env_errors/step"] == 3


def test_a_dead_workers_chunks_are_replaced_when_its_heartbeat_lapses(tmp_path):
    cluster = FakeCluster(processes=2)
    cluster.workers.announce("worker-1", 2)  # two workers of two processes: 8 tasks in flight
    cluster.send.dying = ("worker-1", 3)  # it takes 3 tasks, answers none, and its beat lapses
    cfg = small()
    assert cfg.dispatch.lost_after_s == 30.0
    t0 = time.monotonic()
    result = Run.create(cfg, cluster.factory, run_dir(tmp_path), "run-d").run()
    # Written off as its heartbeat lapsed, not after --lost-after-s (30 s), and replaced.
    assert time.monotonic() - t0 < 20.0
    assert result.env_steps == 16 * CHUNK
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["lost_chunks"] == 3 and summary["chunks_of_dead_workers"] == 3
    assert summary["accepted_chunk_ids"] == [[3, 18]]  # 0-2 died with worker-1
    assert not cluster.takers.taken or set(cluster.takers.taken.values()) == {"worker-0"}


def test_an_evaluation_nobody_answers_is_given_up_at_its_timeout(tmp_path, caplog):
    cluster = FakeCluster()
    cluster.send.silent_evals = True  # its worker lives on, stuck where nothing cuts it off
    cfg = small()
    cfg.evaluation.eval_timeout_s = 0.3
    result = Run.create(cfg, cluster.factory, run_dir(tmp_path), "run-t").run()
    assert result.env_steps == 16 * CHUNK and result.evals == []
    assert "s; given up" in caplog.text
    assert cluster.send.tasks[EVALUATE_TASK] >= 2  # asked again at the next --eval-every


def test_a_ladder_run_sends_a_ladder_over_the_live_actor_envs(tmp_path):
    cluster = FakeCluster(processes=3)
    cfg = small()
    cfg.agent.exploration = "ladder"
    Run.create(cfg, cluster.factory, run_dir(tmp_path), "run-l").run()
    envs = cfg.collection.envs_per_worker
    assert cluster.send.last_behaviour == {"kind": "epsilon_ladder", "epsilon": 0.4, "alpha": 7.0,
                                           "size": 3 * envs}  # fmt: skip


def test_a_run_with_worker_priorities_asks_the_workers_for_them_and_replay_starts_rows_there(
    tmp_path,
):
    """--initial-priority worker: every request carries the n-step window and discount, and the
    rows enter replay at their workers' priorities, not all at one largest value."""
    cluster = FakeCluster()
    cfg = small()
    cfg.agent.prioritized, cfg.agent.initial_priority, cfg.agent.n_step = True, "worker", 3
    cfg.agent.learning_starts = 10**6  # no update: every priority is still the worker's
    run = Run.create(cfg, cluster.factory, run_dir(tmp_path), "run-p")
    run.run()
    request = cluster.send.last_request
    assert (request["priority_n_step"], request["priority_gamma"]) == (3, cfg.agent.gamma)
    sampler = run.agent.learner.replay.sampler
    leaves = sampler.tree.get(np.arange(run.agent.learner.replay.size))
    assert len(np.unique(leaves)) > len(leaves) // 2  # each its own, from the worker's column
