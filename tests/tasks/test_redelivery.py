"""A worker killed mid-chunk: Celery redelivers its task only with CLUSTERENV_REDELIVER=1.

By default the broker delivers a task at most once (no ack emulation: two round trips per task
saved) and the learner's dispatcher replaces the chunk (tests/pipeline/chunks/test_dispatcher.py).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from clusterenv.pipeline.behaviour import EpsilonGreedy
from clusterenv.pipeline.chunks.request import COLLECT_CHUNK_TASK, ChunkRequest
from clusterenv.pipeline.chunks.stream import StreamReader
from clusterenv.pipeline.cluster.embedded import LocalWorkers
from clusterenv.pipeline.connect import connect
from clusterenv.pipeline.keys import RunKeys
from clusterenv.pipeline.policy import NumpyMLP
from clusterenv.pipeline.sync.source import RedisWeightSource
from tests.fakes import CARTPOLE, REF, net, url_of
from tests.worker_log import RECEIVED

# Redelivery happens after the visibility timeout, at a worker's next look for unacked tasks
# (kombu looks every 10 s): 1 s + 10 s, and some slack.
VISIBILITY_S, WAIT_S = 1, 20


def chunks_in_stream(client, run_id: str, timeout_s: float) -> list[int]:
    """Chunk ids that reach the run's stream within `timeout_s`."""
    reader = StreamReader(connect(url_of(client), blocking=True), RunKeys(run_id), CARTPOLE)
    seen: list[int] = []
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and not seen:
        reader.poll(lambda h, a: seen.append(h["chunk"]), block_ms=200)
    return seen


def send_slow_chunk(celery_app, client, run_id: str, queue: str, log: Path) -> None:
    """Publish weights and send one 10 s chunk (one env sleeping 50 ms a step for 200 steps) to
    `queue`; return 1 s after the worker writing `log` received it."""
    source = RedisWeightSource(client, RunKeys(run_id))
    source.publish_reference(REF)
    source.publish(net(0), NumpyMLP(net(0))(REF))
    env_kwargs = {"log_path": str(log.with_suffix(".evals")), "delay_s": 0.05, "eval_delay_s": 0}
    req = ChunkRequest(run_id, 0, "tests.e2e.step_recorder:SlowEval-v0", 1, 200, seed=1,
                       behaviour=EpsilonGreedy(0.1), env_kwargs=env_kwargs)  # fmt: skip
    celery_app.send_task(COLLECT_CHUNK_TASK, kwargs=req.to_json(), queue=queue)
    deadline = time.monotonic() + 30
    while not RECEIVED.search(log.read_text() if log.exists() else ""):
        assert time.monotonic() < deadline, "the worker never received the chunk"
        time.sleep(0.05)
    time.sleep(1.0)


@pytest.mark.slow
@pytest.mark.parametrize("redeliver", ["0", "1"])
def test_a_killed_workers_chunk_is_redelivered_only_when_asked(
    redeliver, redis_url, client, celery_app, run_id, tmp_path, monkeypatch
):
    monkeypatch.setenv("CLUSTERENV_REDELIVER", redeliver)
    monkeypatch.setenv("CLUSTERENV_VISIBILITY_TIMEOUT", str(VISIBILITY_S))
    queue, log = f"q-{run_id}", tmp_path / "w.log"
    pool = LocalWorkers(redis_url, 1, log_path=log, queue=queue)
    try:
        pool.start()
        send_slow_chunk(celery_app, client, run_id, queue, log)
        os.killpg(pool.procs[0].pid, signal.SIGKILL)
        pool.procs[0].wait(timeout=10)
        pool.add(1)  # the worker that could take a redelivered task
        seen = chunks_in_stream(client, run_id, WAIT_S + 10)  # the chunk takes 10 s
        if redeliver == "1":
            assert seen == [0], log.read_text()[-2000:]
        else:
            assert seen == [], seen
            assert client.llen(queue) == 0  # not queued again either: delivered at most once
    finally:
        pool.stop()


@pytest.mark.slow
def test_a_prefork_worker_requeues_the_task_of_a_child_that_died(
    redis_url, client, celery_app, run_id, tmp_path
):
    # Redelivery off (the default): the parent sees its child die and requeues the child's task
    # (acks late, reject on worker lost), and a new child runs it.
    queue, log = f"q-{run_id}", tmp_path / "w.log"
    env = {**os.environ, "CLUSTERENV_REDIS_URL": redis_url, "CLUSTERENV_REDELIVER": "0"}
    cmd = [sys.executable, "-m", "celery", "-A", "clusterenv.tasks", "worker", "--pool", "prefork",
           "--concurrency", "1", "--loglevel", "INFO", "--queues", queue,
           "--hostname", f"prefork-{run_id}@%h"]  # fmt: skip
    with open(log, "ab") as out:
        worker = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT,
                                  stdin=subprocess.DEVNULL, start_new_session=True)  # fmt: skip
    try:
        send_slow_chunk(celery_app, client, run_id, queue, log)
        (child,) = psutil.Process(worker.pid).children()
        child.kill()
        seen = chunks_in_stream(client, run_id, 30)  # the chunk takes 10 s
        assert seen == [0], log.read_text()[-2000:]
        assert "WorkerLostError" in log.read_text()  # the first child did die mid-chunk
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(worker.pid, signal.SIGKILL)
        worker.wait(timeout=10)


def test_a_redelivery_flag_that_is_not_0_or_1_is_refused_by_name():
    env = {**os.environ, "CLUSTERENV_REDELIVER": "yes"}
    out = subprocess.run([sys.executable, "-c", "import clusterenv.celeryconfig"],
                         capture_output=True, text=True, env=env, timeout=60)  # fmt: skip
    assert out.returncode != 0
    assert "CLUSTERENV_REDELIVER must be 0 or 1, got 'yes'" in out.stderr
