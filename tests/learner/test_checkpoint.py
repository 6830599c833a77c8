"""Periodic checkpoints and what a resumed learner takes back (pure logic, no server).

The run is the real one (learner/run/loop.py) with every component real; only its broker is the
in-process FakeCluster of tests/fakes.py. Each component saves and restores itself
(learner/persistence/components.py gathers them).
"""

from __future__ import annotations

import json
import logging
import struct
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from clusterenv.learner.config import TrainConfig
from clusterenv.learner.persistence.checkpoint import CheckpointError, Checkpoints, load_checkpoint
from clusterenv.learner.persistence.components import gather
from clusterenv.learner.persistence.resume import (
    Resumed,
    check_overrides,
    lock_run_dir,
    next_run_id,
    record_run_id,
    run_ids,
    saved_config,
)
from clusterenv.learner.run.ingest import Arrival
from clusterenv.learner.run.loop import Run
from tests.fakes import FakeClock
from tests.inprocess import FakeCluster


def make_run(tmp_path: Path, checkpoint_replay: bool = True, seed: int = 0,
             resume: Resumed | None = None) -> Run:  # fmt: skip
    """A DQN run on CartPole's spaces with small settings, its broker in process."""
    cfg = TrainConfig(seed=seed)
    d = cfg.agent
    d.hidden, d.batch_size, d.target_update_every = "32", 16, 7
    d.buffer_size, d.learning_starts, d.samples_per_insert = 300, 16, 2.0
    # 8-step chunks: the limiter's band is 64 transitions wide, as 4 chunks of collection.
    cfg.collection.envs_per_worker, cfg.collection.chunk_steps = 2, 4
    cfg.weights.reference_size = 8
    cfg.checkpoint.checkpoint_replay, cfg.checkpoint.checkpoints_kept = checkpoint_replay, 2
    run_dir = tmp_path / f"run-{seed}-{len(list(tmp_path.iterdir()))}"
    run_dir.mkdir()
    return Run.create(cfg, FakeCluster().factory, run_dir, "run-a", resume)


def train_a_while(run: Run, chunks: int = 5) -> None:
    """Insert chunks (as ingest does), record their arrivals, take gradient steps, publish."""
    rng = np.random.default_rng(7)
    for c in range(chunks):
        n = 64
        obs = rng.normal(size=(n, 4)).astype(np.float32)
        run.ingest.store({"chunk": c, "policy_version": 0},
                   {"obs": obs, "action": rng.integers(2, size=n),
                    "reward": rng.normal(size=n).astype(np.float32), "next_obs": obs + 0.1,
                    "terminated": rng.random(n) < 0.05})  # fmt: skip
        header = {"chunk": c, "worker": f"w{c % 2}", "env_steps": n, "divergence": 0.01 * c,
                  "sync": {"weight_fetches": c}, "episodes": [[10.0 + c, 10]]}  # fmt: skip
        run.accounting.record(Arrival(header, n, c % 3, 5 * c))
        while run.learner.step():
            pass
        run.publish()
    run.dispatcher.next_id, run.dispatcher.lost = 9, 1
    run.evaluation.next_id, run.evaluation.errors = 3, 1
    s = run.schedule
    s.next_eval, s.asked_at, s.evals, s.hits = 4000, 2000, [(2000, 21.5)], 1
    stats = run.ingest.reader.stats
    stats.chunks, stats.rejected_reasons = chunks, {"foreign run 'x'": 2}


def capture(run: Run, wall_s: float) -> tuple[dict[str, torch.Tensor], dict]:
    """A checkpoint's contents, taken `wall_s` seconds into the run."""
    run.t0 = time.perf_counter() - wall_s
    return gather(run.components())


def assert_same_state(a: Run, b: Run) -> None:
    ta, sa = capture(a, 12.5)
    tb, sb = capture(b, 12.5)
    assert sorted(ta) == sorted(tb)
    for name in ta:
        assert ta[name].dtype == tb[name].dtype and torch.equal(ta[name], tb[name]), name
    sa.pop("run"), sb.pop("run")  # its wall clock
    assert json.loads(json.dumps(sa)) == json.loads(json.dumps(sb))


def resumed_from(tmp_path: Path, tensors: dict, state: dict, newest_version: int = -1,
                 replay: bool = True, seed: int = 5) -> Run:  # fmt: skip
    resume = Resumed(tmp_path / "ckpt", tensors, state, ["run-a"], newest_version)
    return make_run(tmp_path, replay, seed=seed, resume=resume)


def saved_and_restored(tmp_path: Path, replay: bool) -> tuple[Run, Run]:
    a = make_run(tmp_path, replay)
    train_a_while(a)
    Checkpoints(tmp_path, a.cfg.checkpoint).save(*capture(a, 12.5), a.learner.updates)
    _, tensors, state = Checkpoints(tmp_path, a.cfg.checkpoint).newest()
    # different initial weights and generators
    return a, resumed_from(tmp_path, tensors, state, replay=replay)


def test_a_checkpoint_round_trip_restores_every_tensor_and_counter(tmp_path):
    a, b = saved_and_restored(tmp_path, replay=True)
    assert a.learner.updates > 20 and b.learner.updates == a.learner.updates
    assert_same_state(a, b)
    assert b.publisher.version == a.publisher.version and round(b.wall_before, 1) == 12.5
    assert b.accounting.env_steps == a.accounting.env_steps == 320
    assert b.accounting.sync_totals() == a.accounting.sync_totals()
    assert b.schedule.evals == [(2000, 21.5)] and b.dispatcher.next_id == 9
    # Networks, Adam's moments and the sampling generator all came back: the next updates match.
    for run in (a, b):
        run.agent.limiter.on_insert(64)
        for _ in range(8):
            assert run.learner.step()
    for x, y in zip(a.learner.q.parameters(), b.learner.q.parameters(), strict=True):
        assert torch.equal(x, y)


def test_without_replay_the_resumed_learner_refills_before_it_learns(tmp_path):
    a, b = saved_and_restored(tmp_path, replay=False)
    assert b.learner.replay.size == 0 and b.agent.limiter.inserts == 0
    assert not b.learner.step()  # nothing to learn from until --learning-starts rows arrived
    for x, y in zip(a.learner.target.parameters(), b.learner.target.parameters(), strict=True):
        assert torch.equal(x, y)
    opt_a, opt_b = a.learner.optimizer.state_dict(), b.learner.optimizer.state_dict()
    for i, per_param in opt_a["state"].items():
        for name, value in per_param.items():
            assert torch.equal(value, opt_b["state"][i][name]), (i, name)


def test_versions_continue_above_everything_a_dead_learner_published(tmp_path):
    a = make_run(tmp_path)
    train_a_while(a)
    tensors, state = capture(a, 1.0)
    b = resumed_from(tmp_path, tensors, state, newest_version=40)  # the broker saw v40 since
    assert b.publisher.publish(b.learner.get_weights(), b.learner.updates) == 41
    c = resumed_from(tmp_path, tensors, state)  # the broker forgot: the checkpoint's own
    assert c.publisher.publish(c.learner.get_weights(), 0) == a.publisher.version + 1


def test_an_evaluation_in_flight_is_asked_for_again_after_resume(tmp_path):
    a = make_run(tmp_path)
    train_a_while(a)
    a.evaluation.request(a.publisher.version, 2000, parts=1)
    _, state = capture(a, 1.0)
    assert state["schedule"]["next_eval"] == 2000 and state["schedule"]["asked_at"] == -1


def test_only_the_newest_checkpoints_are_kept(tmp_path):
    a = make_run(tmp_path)
    store = Checkpoints(tmp_path, a.cfg.checkpoint)
    (tmp_path / "checkpoints").mkdir()
    (tmp_path / "checkpoints" / "ckpt-00000099.safetensors.tmp").write_bytes(b"cut short")
    for updates in range(5):
        store.save(*capture(a, 0.0), updates)
    assert [p.name for p in store.paths()] == [
        "ckpt-00000003.safetensors",
        "ckpt-00000004.safetensors",
    ]
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == [
        p.name for p in store.paths()
    ]  # the leftover temporary file of a killed write is gone too


def test_checkpoints_are_due_by_time_or_by_updates(tmp_path):
    cfg = make_run(tmp_path).cfg.checkpoint
    cfg.checkpoint_every_s, cfg.checkpoint_every_updates = 10.0, 100
    clock = FakeClock()
    store = Checkpoints(tmp_path, cfg, clock)
    assert not store.due(99)
    assert store.due(100)
    clock.advance(10.0)
    assert store.due(0)
    cfg.checkpoint_every_s = cfg.checkpoint_every_updates = 0
    assert not store.due(10**9)


def _corrupt(path: Path, how: str) -> None:
    data = bytearray(path.read_bytes())
    if how == "truncated":
        path.write_bytes(bytes(data[: len(data) // 2]))
    else:  # one flipped bit in the last tensor's bytes
        data[-3] ^= 0x10
        path.write_bytes(bytes(data))


@pytest.mark.parametrize("how,reason", [("truncated", "not a readable safetensors file"),
                                        ("flipped", "damaged")])  # fmt: skip
def test_a_damaged_checkpoint_is_refused_by_name_and_the_one_before_used(
    tmp_path, caplog, how, reason
):
    a = make_run(tmp_path)
    store = Checkpoints(tmp_path, a.cfg.checkpoint)
    store.save(*capture(a, 0.0), 0)
    train_a_while(a)
    newest = store.save(*capture(a, 0.0), a.learner.updates)
    _corrupt(newest, how)
    with pytest.raises(CheckpointError, match=reason) as err:
        load_checkpoint(newest)
    assert newest.name in str(err.value)
    with caplog.at_level(logging.WARNING):
        path, _, state = store.newest()
    assert path.name == "ckpt-00000000.safetensors" and state["learner"]["updates"] == 0
    assert newest.name in caplog.text and reason in caplog.text
    _corrupt(path, how)
    with pytest.raises(CheckpointError, match="no usable checkpoint"):
        store.newest()


def test_a_checkpoint_is_safetensors_and_json_only_never_pickle(tmp_path):
    a = make_run(tmp_path)
    train_a_while(a)
    path = Checkpoints(tmp_path, a.cfg.checkpoint).save(*capture(a, 0.0), 1)
    data = path.read_bytes()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + n])
    meta = header.pop("__metadata__")
    assert all(isinstance(v, str) for v in meta.values())
    json.loads(meta["state"])  # structured state is JSON
    # Every byte after the header belongs to a tensor: nothing else (no pickle) is stored.
    ends = sorted(e for t in header.values() for e in t["data_offsets"])
    assert 8 + n + ends[-1] == len(data)
    assert sum(e - s for s, e in (t["data_offsets"] for t in header.values())) == ends[-1]
    assert {
        "learner.replay.obs",
        "learner.optim.0.exp_avg",
        "learner.target.layers.0.weight",
        "learner.rng.torch",
        "accounting.lag_versions",
    } <= set(header)


def test_a_resumed_run_keeps_its_config_except_what_may_change(tmp_path):
    saved = make_run(tmp_path).cfg
    (tmp_path / "config.json").write_text(saved.to_json())
    assert saved_config(tmp_path) == saved
    given = saved_config(tmp_path)
    given.total_steps, given.workers, given.checkpoint.checkpoint_every_s = 5, 1, 2.0
    check_overrides(saved, given)  # allowed
    given.agent.lr = 0.5
    with pytest.raises(
        ValueError, match=r"^--lr 0.5 contradicts the run's 0.0023; .*--total-steps"
    ):
        check_overrides(saved, given)
    (tmp_path / "config.json").write_text(json.dumps({"env": "CartPole-v1", "no_such": 1}))
    with pytest.raises(ValueError, match="unknown setting 'no_such'"):
        saved_config(tmp_path)
    with pytest.raises(ValueError, match="not a run directory"):
        saved_config(tmp_path / "nowhere")


def test_each_learner_of_a_run_directory_gets_its_own_run_id_and_the_lock(tmp_path):
    run_dir = tmp_path / "CartPole-v1__s1__x"
    run_dir.mkdir()
    assert run_ids(run_dir) == [run_dir.name]  # before any was recorded: the directory's name
    record_run_id(run_dir, run_dir.name)
    assert next_run_id(run_dir) == f"{run_dir.name}.r1"
    record_run_id(run_dir, next_run_id(run_dir))
    assert run_ids(run_dir) == [run_dir.name, f"{run_dir.name}.r1"]
    with lock_run_dir(run_dir), pytest.raises(ValueError, match="in use by a running learner"):
        lock_run_dir(run_dir)
    lock_run_dir(run_dir).close()  # free again once the holder closed it


def test_a_resume_asks_again_for_a_password_config_json_does_not_keep():
    from clusterenv.learner.persistence.resume import check_overrides

    saved = TrainConfig(redis_url="redis://:***@broker:6379/0")
    with pytest.raises(ValueError, match="give --redis-url again"):
        check_overrides(saved, TrainConfig(redis_url=saved.redis_url))
    check_overrides(saved, TrainConfig(redis_url="redis://:secret@broker:6379/0"))


def test_a_run_directory_of_the_layout_before_per_agent_settings_is_refused_by_name(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"env": "CartPole-v1", "dqn": {"lr": 1e-3}}))
    with pytest.raises(ValueError, match="written by an older clusterenv"):
        saved_config(tmp_path)
    a = make_run(tmp_path)
    path = Checkpoints(tmp_path, a.cfg.checkpoint).save(*capture(a, 0.0), 0)
    data = path.read_bytes().replace(b"clusterenv-checkpoint/2", b"clusterenv-checkpoint/1")
    path.write_bytes(data)
    with pytest.raises(CheckpointError, match="written by an older clusterenv"):
        load_checkpoint(path)


COMPONENTS = ["run", "learner", "publisher", "dispatch", "evaluation", "schedule", "accounting",
              "ingest"]  # fmt: skip


@pytest.mark.parametrize("name", COMPONENTS)
def test_each_component_saves_and_restores_itself(tmp_path, name):
    """Each component alone: what a trained run's saves, a fresh run's takes back whole."""
    a = make_run(tmp_path)
    assert sorted(a.components()) == sorted(COMPONENTS)  # a new component needs its case here
    train_a_while(a)
    b = make_run(tmp_path, seed=5)
    arrays, values = a.components()[name].save()
    assert arrays or values
    b.components()[name].restore(arrays, values)
    if name == "run":  # its wall clock: the learners before this one ran that long
        assert b.wall_before == values["wall_s"]
        return
    again, values_again = b.components()[name].save()
    assert sorted(again) == sorted(arrays)
    for key, array in arrays.items():
        assert again[key].dtype == array.dtype and np.array_equal(again[key], array), key
    assert json.loads(json.dumps(values_again)) == json.loads(json.dumps(values))
