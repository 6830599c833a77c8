"""Greedy evaluation on real workers: the same returns as a local rollout, split over tasks,
results taken once whatever arrives twice or late, and workers that only evaluate."""

from __future__ import annotations

import json
import time

import gymnasium as gym
import numpy as np
import pytest

from clusterenv.learner.run.evaluation import RemoteEvaluation
from clusterenv.pipeline.chunks.actor import env_seeds, eval_seeds
from clusterenv.pipeline.chunks.request import COLLECT_CHUNK_TASK
from clusterenv.pipeline.cluster.celery_client import celery_client
from clusterenv.pipeline.cluster.embedded import Stack
from clusterenv.pipeline.cluster.registry import WorkerRegistry
from clusterenv.pipeline.connect import connect
from clusterenv.pipeline.evaluation.request import EvalRequest
from clusterenv.pipeline.evaluation.results import RedisEvalResults
from clusterenv.pipeline.evaluation.runner import greedy_returns
from clusterenv.pipeline.keys import COLLECT_QUEUE, EVAL_QUEUE, RunKeys
from clusterenv.pipeline.policy import NumpyMLP
from clusterenv.pipeline.sync.source import RedisWeightSource
from tests.fakes import FakeClock, RecordingSend, net, url_of

pytestmark = pytest.mark.timeout(120)


def remote(client, keys: RunKeys, send, *args, **kwargs) -> RemoteEvaluation:
    """The learner's RemoteEvaluation on the real broker's roles."""
    return RemoteEvaluation(keys.run_id, RedisEvalResults(client, keys), WorkerRegistry(client),
                            send, *args, **kwargs)  # fmt: skip


def wait_for(evaluation: RemoteEvaluation, timeout_s: float = 60.0):
    deadline = time.monotonic() + timeout_s
    while True:
        done = list(evaluation.results())
        if done:
            return done
        assert time.monotonic() < deadline, "evaluation did not come back"
        time.sleep(0.05)


def local_returns(weights, seeds: list[int]) -> np.ndarray:
    envs = gym.vector.SyncVectorEnv([lambda: gym.make("CartPole-v1")] * len(seeds))
    try:
        return greedy_returns(envs, NumpyMLP(weights), seeds)
    finally:
        envs.close()


@pytest.mark.parametrize("parts", [1, 3])
def test_workers_return_what_a_local_rollout_returns(workers, client, run_id, parts):
    RedisWeightSource(client, RunKeys(run_id)).publish(net(0))
    celery = celery_client(url_of(client))
    try:
        evaluation = remote(
            client, RunKeys(run_id), lambda name, kw: celery.send_task(name, kwargs=kw),
            "CartPole-v1", {}, episodes=5, seed=100,
        )  # fmt: skip
        evaluation.request(version=0, env_steps=1234, parts=parts)
        (result,) = wait_for(evaluation)
    finally:
        celery.close()
    assert result.version == 0 and result.env_steps == 1234
    assert result.versions_evaluated == {0}
    np.testing.assert_array_equal(result.returns, local_returns(net(0), eval_seeds(100, 0, 5)))
    assert evaluation.pending is None


def test_a_worker_that_only_evaluates_is_counted_apart_and_takes_no_chunk(tmp_path, run_id):
    # Its own server: the session's workers take every queue.
    with Stack(None, workers=0, log_path=tmp_path / "w.log", eval_workers=1) as stack:
        assert stack.redis_url is not None
        client = connect(stack.redis_url)
        registry = WorkerRegistry(client)
        assert (registry.alive_processes(), registry.alive_processes(eval_only=True)) == (0, 1)
        RedisWeightSource(client, RunKeys(run_id)).publish(net(0))
        celery = celery_client(stack.redis_url)
        try:
            send = lambda name, kw: celery.send_task(name, kwargs=kw)  # noqa: E731
            evaluation = remote(
                client, RunKeys(run_id), send, "CartPole-v1", {}, episodes=3, seed=5
            )
            evaluation.request(version=0, env_steps=0, parts=2)
            (result,) = wait_for(evaluation)  # evaluation is routed to the worker's queue
            send(COLLECT_CHUNK_TASK, {})  # a chunk goes to Celery's default queue, not taken
            time.sleep(2.0)
        finally:
            celery.close()
        assert client.llen(COLLECT_QUEUE) == 1 and client.llen(EVAL_QUEUE) == 0
    np.testing.assert_array_equal(result.returns, local_returns(net(0), eval_seeds(5, 0, 3)))


def test_parts_split_the_episodes_and_duplicates_count_once(client, run_id):
    keys, send, clock = RunKeys(run_id), RecordingSend(), FakeClock()
    evaluation = remote(client, keys, send, "CartPole-v1", {}, 5, seed=10, clock=clock)
    evaluation.request(version=3, env_steps=50, parts=2)
    reqs = [EvalRequest.from_json(kw) for _, kw in send.sent]
    seeds = eval_seeds(10, 0, 5)
    assert [r.seeds for r in reqs] == [seeds[:3], seeds[3:]]
    assert min(seeds) > max(env_seeds(10, 1000, 64))  # apart from the collection seeds
    part = {"eval": 0, "version": 3, "worker": "w"}
    client.rpush(keys.eval_results, json.dumps(part | {"part": 0, "returns": [1.0, 2.0, 3.0]}))
    client.rpush(keys.eval_results, json.dumps(part | {"part": 0, "returns": [9.0, 9.0, 9.0]}))
    assert list(evaluation.results()) == [] and evaluation.pending is not None
    clock.advance(7.0)
    assert evaluation.waiting_s() == 7.0
    client.rpush(keys.eval_results, b"not json")
    client.rpush(keys.eval_results, json.dumps(part | {"part": 1, "returns": [4.0, 5.0]}))
    (result,) = list(evaluation.results())
    np.testing.assert_array_equal(result.returns, [1, 2, 3, 4, 5])  # the redelivery was dropped
    assert evaluation.errors == 1  # the junk entry, counted and skipped
    # A late part of an evaluation already finished is ignored.
    client.rpush(keys.eval_results, json.dumps(part | {"part": 1, "returns": [0.0, 0.0]}))
    assert list(evaluation.results()) == []


def test_a_part_whose_worker_is_gone_loses_the_evaluation(client, run_id):
    keys, clock = RunKeys(run_id), FakeClock()
    evaluation = remote(client, keys, RecordingSend(), "CartPole-v1", {}, 4, 10, clock)
    evaluation.request(version=3, env_steps=50, parts=2)
    alive, dead = f"alive-{run_id}@h", f"dead-{run_id}@h"
    WorkerRegistry(client).announce(alive, 1, ttl_s=60)
    assert evaluation.lost_to() is None  # no part taken yet (still queued)
    client.hset(keys.eval_takers, mapping={"0:0": alive, "0:1": dead})
    assert evaluation.lost_to() is None  # looked a moment ago: once a second at most
    clock.advance(1.0)
    # Part 1's answer is in the list, unread: its worker's heartbeat may have gone after it.
    part = {"eval": 0, "version": 3, "worker": "w"}
    client.rpush(keys.eval_results, json.dumps(part | {"part": 1, "returns": [4.0, 5.0]}))
    assert evaluation.lost_to() is None
    assert list(evaluation.results()) == []  # part 1 is in; part 0's worker is alive
    clock.advance(1.0)
    assert evaluation.lost_to() is None
    client.hset(keys.eval_takers, "0:0", dead)  # part 0 again, taken by the dead worker
    clock.advance(1.0)
    assert evaluation.lost_to() == dead
    evaluation.abandon()
    assert evaluation.lost_to() is None  # nothing in flight
    assert not client.exists(keys.eval_takers)  # and its parts' takers are gone from the broker


def test_an_evicted_version_is_evaluated_as_the_newest_and_said_so(workers, client, run_id):
    keys = RunKeys(run_id)
    source = RedisWeightSource(client, keys, keep=1)
    source.publish(net(0))
    source.publish(net(5))  # v0 is deleted
    celery = celery_client(url_of(client))
    try:
        evaluation = remote(
            client, keys, lambda name, kw: celery.send_task(name, kwargs=kw),
            "CartPole-v1", {}, episodes=2, seed=7,
        )  # fmt: skip
        evaluation.request(version=0, env_steps=0, parts=1)
        (result,) = wait_for(evaluation)
    finally:
        celery.close()
    assert result.version == 0 and result.versions_evaluated == {1}
    np.testing.assert_array_equal(result.returns, local_returns(net(5), eval_seeds(7, 0, 2)))


@pytest.mark.parametrize(
    "bad, message",
    [({"seeds": []}, "seeds must not be empty"), ({"version": "3"}, "EvalRequest.version")],
)
def test_bad_eval_requests_are_refused(bad, message):
    good = EvalRequest("r", 0, 0, 0, "CartPole-v1", [1, 2]).to_json()
    with pytest.raises(ValueError, match=message):
        EvalRequest.from_json(good | bad)
