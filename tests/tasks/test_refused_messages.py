"""Real workers refuse what they must not run: a pickle-serialized Celery message (never even
unpickled) and task arguments that do not fit their dataclass (refused by name)."""

from __future__ import annotations

import pathlib
import time

from clusterenv.pipeline.behaviour import EpsilonGreedy
from clusterenv.pipeline.chunks.request import COLLECT_CHUNK_TASK, ChunkRequest
from clusterenv.pipeline.cluster.celery_client import celery_client
from clusterenv.pipeline.keys import RunKeys
from clusterenv.pipeline.sync.source import RedisWeightSource
from tests.fakes import net


class TouchOnUnpickle:
    """Unpickling this creates `path`: proof, if the file appears, that a worker unpickled it."""

    def __init__(self, path: pathlib.Path):
        self.path = path

    def __reduce__(self):
        return pathlib.Path.touch, (self.path,)


def wait_for_log(workers, text: str, timeout_s: float = 30.0) -> str:
    deadline = time.monotonic() + timeout_s
    while text not in (log := workers.log_path.read_text()):
        assert time.monotonic() < deadline, f"the workers' log never said {text!r}"
        time.sleep(0.1)
    return log


def test_a_pickled_task_message_is_refused(workers, redis_url, client, run_id, tmp_path):
    keys, control = RunKeys(run_id), RunKeys(f"{run_id}-json")
    for k in (keys, control):
        RedisWeightSource(client, k).publish(net(0))
    marker = tmp_path / "unpickled"
    sender = celery_client(redis_url, "pickle-sender")
    sender.conf.update(task_serializer="pickle", accept_content=["pickle", "json"])
    req = ChunkRequest(
        run_id, 0, "CartPole-v1", 2, 5, seed=1, behaviour=EpsilonGreedy(0.5)
    ).to_json()
    sender.send_task(
        COLLECT_CHUNK_TASK, kwargs={**req, "env_kwargs": {"x": TouchOnUnpickle(marker)}}
    )
    # The same request as JSON, for another run, after it: once that one is served, the
    # pickled one has been taken off the queue too (both go to the same two workers).
    ok = ChunkRequest(
        control.run_id, 0, "CartPole-v1", 2, 5, seed=1, behaviour=EpsilonGreedy(0.5)
    ).to_json()
    sender.send_task(COLLECT_CHUNK_TASK, kwargs=ok, serializer="json")
    deadline = time.monotonic() + 30
    while client.xlen(control.stream) == 0:
        assert time.monotonic() < deadline, "the JSON control chunk was never served"
        time.sleep(0.1)
    log = wait_for_log(workers, "Refusing to deserialize untrusted content of type pickle")
    assert "application/x-python-serialize" in log
    assert not marker.exists(), "a worker unpickled the message"
    assert client.xlen(keys.stream) == 0 and not client.exists(keys.actor_counter)
    assert all(p.poll() is None for p in workers.procs)


def test_bad_task_arguments_are_refused_by_name(workers, celery_app, client, run_id):
    keys = RunKeys(run_id)
    RedisWeightSource(client, keys).publish(net(0))
    bad = {
        **ChunkRequest(
            run_id, 0, "CartPole-v1", 2, 5, seed=1, behaviour=EpsilonGreedy(0.5)
        ).to_json()
    }
    bad["behaviour"]["epsilon"] = 7.5
    celery_app.send_task(COLLECT_CHUNK_TASK, kwargs=bad)
    wait_for_log(
        workers, "TaskArgsError('ChunkRequest.behaviour: epsilon must be in [0, 1], got 7.5')"
    )
    assert client.xlen(keys.stream) == 0
    assert all(p.poll() is None for p in workers.procs)
