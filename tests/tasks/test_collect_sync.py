"""APS through real workers: the divergence a worker measures does not depend on its env count."""

from __future__ import annotations

import time

import pytest

from clusterenv.pipeline.behaviour import EpsilonGreedy
from clusterenv.pipeline.chunks.request import COLLECT_CHUNK_TASK, ChunkRequest
from clusterenv.pipeline.chunks.stream import StreamReader
from clusterenv.pipeline.cluster.embedded import LocalWorkers
from clusterenv.pipeline.cluster.registry import WorkerRegistry
from clusterenv.pipeline.connect import connect
from clusterenv.pipeline.keys import RunKeys
from clusterenv.pipeline.policy import NumpyMLP
from clusterenv.pipeline.sync.source import RedisWeightSource
from tests.fakes import CARTPOLE, REF, net, url_of


def run_two_versions(celery_app, client, run_id: str, num_envs: int, queue: str) -> list[dict]:
    """v0, one chunk, then v1 with other weights, one more chunk; the chunk headers."""
    keys = RunKeys(run_id)
    source = RedisWeightSource(client, keys)
    source.publish_reference(REF)
    reader = StreamReader(connect(url_of(client), blocking=True), keys, CARTPOLE)
    headers: list[dict] = []
    for chunk_id, seed in enumerate([0, 4]):
        source.publish(net(seed), NumpyMLP(net(seed))(REF))
        req = ChunkRequest(
            run_id,
            chunk_id,
            "CartPole-v1",
            num_envs,
            4,
            seed=1,
            behaviour=EpsilonGreedy(0.1),
            sync="aps:0",
        )
        celery_app.send_task(COLLECT_CHUNK_TASK, kwargs=req.to_json(), queue=queue)
        deadline = time.monotonic() + 30
        while len(headers) <= chunk_id:
            assert time.monotonic() < deadline, "chunk did not arrive"
            reader.poll(lambda h, a: headers.append(h))
    return headers


@pytest.fixture
def one_worker(redis_url, client, run_id, tmp_path):
    """One worker of our own on a private queue, so both chunks meet the same cached policy."""
    pool = LocalWorkers(redis_url, 1, log_path=tmp_path / "w.log", queue=f"q-{run_id}")
    before = WorkerRegistry(client).alive_processes()
    pool.start()
    try:
        pool.wait_ready(client, expected=before + 1)
        yield pool.queue
    finally:
        pool.stop()


def test_divergence_is_the_same_at_1_and_64_envs(one_worker, celery_app, client, run_id):
    measured = []
    for n in (1, 64):
        headers = run_two_versions(celery_app, client, f"{run_id}-{n}", n, one_worker)
        assert headers[0]["divergence"] is None  # the first chunk just fetches v0
        assert headers[1]["policy_version"] == 1  # D > 0 = tolerance: fetched
        assert headers[1]["sync"]["probe_fetches"] == 2, headers  # probe and reference batch
        measured.append(headers[1]["divergence"])
    q_learner, q_worker = NumpyMLP(net(4))(REF), NumpyMLP(net(0))(REF)
    from clusterenv.pipeline.sync.divergence import value

    assert measured[0] == measured[1] == pytest.approx(value(q_learner, q_worker, 0.1))
    assert measured[0] > 0
