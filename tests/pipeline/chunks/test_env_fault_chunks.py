"""Chunks whose env raised, through a worker's runtime, a real stream and real Celery workers: the
chunk reaches the learner at once with the steps before the fault and the fault in its header
(a header alone when there were none), the worker builds its envs anew, and nothing is lost."""

from __future__ import annotations

import json
import re
import time

import gymnasium as gym
import numpy as np
import pytest

from bench.envs import FLAKY_CARTPOLE
from clusterenv.pipeline.behaviour import EpsilonGreedy
from clusterenv.pipeline.chunks.request import COLLECT_CHUNK_TASK, ChunkRequest
from clusterenv.pipeline.chunks.runtime import WorkerRuntime
from clusterenv.pipeline.chunks.stream import StreamReader, StreamWriter
from clusterenv.pipeline.codec import ArraySpec, encode_chunk
from clusterenv.pipeline.connect import connect
from clusterenv.pipeline.keys import RunKeys
from clusterenv.pipeline.spaces import DiscreteActions, SpaceSpecs
from clusterenv.pipeline.sync.source import RedisWeightSource
from tests.fakes import CARTPOLE, url_of
from tests.pipeline.chunks.test_env_faults import Breaks

gym.register("BreaksAt-v0", entry_point=Breaks)
COUNTER = SpaceSpecs(ArraySpec("<f4", (1,)), DiscreteActions(2))  # Countdown's spaces
COUNTER_POLICY = {"layers.0.weight": np.array([[0.0], [1.0]], np.float32),
                  "layers.0.bias": np.zeros(2, np.float32)}  # fmt: skip
CARTPOLE_POLICY = {"layers.0.weight": np.zeros((2, 4), np.float32),
                   "layers.0.bias": np.zeros(2, np.float32)}  # fmt: skip


def read_all(client, keys: RunKeys, spaces: SpaceSpecs, expected: int, timeout_s: float = 30.0):
    reader = StreamReader(connect(url_of(client), blocking=True), keys, spaces)
    got: list[tuple[dict, dict]] = []
    deadline = time.monotonic() + timeout_s
    while reader.stats.chunks + reader.stats.rejected < expected:
        assert time.monotonic() < deadline, f"only {len(got)} of {expected} chunks arrived"
        reader.poll(lambda h, a: got.append((h, {k: v.copy() for k, v in a.items()})))
    return reader, got


def test_a_chunk_whose_env_raises_keeps_the_steps_before_and_the_envs_are_built_anew(
    client, run_id
):
    keys = RunKeys(run_id)
    RedisWeightSource(client, keys).publish(COUNTER_POLICY)
    runtime = WorkerRuntime(client, "w:1")
    kwargs = {"length": 10, "method": "step", "fail_at": 5}  # each env's 5th step raises
    req = ChunkRequest(run_id, 0, "BreaksAt-v0", 1, 8, seed=3, behaviour=EpsilonGreedy(0.0),
                       env_kwargs=kwargs, chunks=2)  # fmt: skip
    summary = runtime.run_chunk(req)
    assert summary["chunks_done"] == 2 and summary["env_errors"] == 2
    assert summary["env_error"] == {"kind": "step", "error": "ValueError: step number 5 broke"}
    assert run_id not in runtime.runs  # closed after the fault
    assert int(client.get(keys.actor_counter)) == 2  # the second chunk built its envs anew
    reader, got = read_all(client, keys, COUNTER, 2)
    assert reader.stats.rejected == 0 and reader.stats.transitions == 8
    for header, arrays in got:  # steps 1-4 of a fresh episode each time
        assert header["env_error"]["kind"] == "step" and header["env_steps"] == 4
        assert arrays["obs"][:, 0].tolist() == [0.0, 1.0, 2.0, 3.0]


def test_envs_that_fail_to_reset_send_a_header_alone_per_chunk(client, run_id):
    keys = RunKeys(run_id)
    RedisWeightSource(client, keys).publish(CARTPOLE_POLICY)
    runtime = WorkerRuntime(client, "w:1")
    req = ChunkRequest(run_id, 0, FLAKY_CARTPOLE, 2, 8, seed=3, behaviour=EpsilonGreedy(0.0),
                       env_kwargs={"reset_crash_p": 1.0}, chunks=3)  # fmt: skip
    summary = runtime.run_chunk(req)
    assert summary["chunks_done"] == 3 and summary["env_errors"] == 3 and summary["steps"] == 0
    reader, got = read_all(client, keys, CARTPOLE, 3)
    assert reader.stats.rejected == 0 and reader.stats.transitions == 0
    assert sorted(h["chunk"] for h, _ in got) == [0, 1, 2]
    for header, arrays in got:
        assert arrays == {} and header["env_steps"] == 0
        assert header["env_error"] == {"kind": "reset",
                                       "error": "SimulatedCrash: simulated crash in reset"}  # fmt: skip


@pytest.mark.parametrize(
    ("header", "reason"),
    [
        ({}, "an entry without arrays must carry 'env_error'"),
        ({"env_error": {"kind": "crash", "error": "x"}}, "header field 'env_error' must be"),
        ({"env_error": "step"}, "header field 'env_error' must be"),
    ],
)
def test_a_bad_fault_report_is_refused_by_name(client, run_id, header, reason):
    keys = RunKeys(run_id)
    base = {"run": run_id, "chunk": 0, "worker": "w:1", "policy_version": 0}
    client.xadd(keys.stream, encode_chunk(base | header, {}))
    reader, got = read_all(client, keys, CARTPOLE, 1)
    assert not got and reader.stats.rejected == 1
    assert any(reason in r for r in reader.stats.rejected_reasons), reader.stats.rejected_reasons


def test_a_worker_reports_its_envs_fault_and_its_task_succeeds(workers, celery_app, client, run_id):
    keys = RunKeys(run_id)
    RedisWeightSource(client, keys).publish(CARTPOLE_POLICY)
    req = ChunkRequest(run_id, 7, FLAKY_CARTPOLE, 2, 8, seed=3, behaviour=EpsilonGreedy(0.0),
                       env_kwargs={"step_crash_p": 1.0})  # fmt: skip
    result = celery_app.send_task(COLLECT_CHUNK_TASK, kwargs=req.to_json())
    reader, got = read_all(client, keys, CARTPOLE, 1)
    ((header, arrays),) = got
    assert header["chunk"] == 7 and arrays == {}
    assert header["env_error"] == {
        "kind": "step",
        "error": "SimulatedCrash: simulated crash in step",
    }
    # The task itself succeeded, its summary counting the fault; the log names the fault.
    succeeded = re.compile(
        rf"Task {COLLECT_CHUNK_TASK}\[{result.id}\] succeeded in [^:]+: (\{{.*\}})$", re.M
    )
    deadline = time.monotonic() + 30
    while not (found := succeeded.search(log := workers.log_path.read_text())):
        assert time.monotonic() < deadline, "the task's success never reached the worker log"
        time.sleep(0.1)
    summary = json.loads(found[1])
    assert summary["env_errors"] == 1 and summary["transitions"] == 0
    assert f"chunk 7 of {run_id}: env fault in step: SimulatedCrash" in log


def test_a_writer_sends_a_fault_report_as_a_header_alone(client, run_id):
    keys = RunKeys(run_id)
    header = {"run": run_id, "chunk": 1, "worker": "w:1", "policy_version": 0,
              "env_error": {"kind": "hang", "error": "cut off after its time limit of 2 s"}}  # fmt: skip
    StreamWriter(client, keys).write(header, {})
    reader, got = read_all(client, keys, CARTPOLE, 1)
    assert got[0][0]["env_error"]["kind"] == "hang" and got[0][1] == {}
    assert reader.stats.chunks == 1 and reader.stats.transitions == 0
