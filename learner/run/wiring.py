"""The run's connections, in one place: the roles it talks to the broker through (`Broker`), and
their Redis and Celery implementations (`redis_broker`). Tests hand the run in-process fakes of the
same roles (tests/fakes.py), so the loop runs without a server."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from clusterenv.learner.config import WeightSyncConfig
from clusterenv.pipeline.chunks.stream import StreamReader
from clusterenv.pipeline.cluster.celery_client import celery_client
from clusterenv.pipeline.cluster.registry import WorkerRegistry
from clusterenv.pipeline.cluster.run_flags import RedisRunFlags
from clusterenv.pipeline.cluster.status_board import RedisStatusBoard
from clusterenv.pipeline.codec import ArraySpec
from clusterenv.pipeline.connect import connect
from clusterenv.pipeline.evaluation.results import RedisEvalResults
from clusterenv.pipeline.keys import RunKeys
from clusterenv.pipeline.roles import (
    EvalResults,
    RunFlags,
    SendTask,
    StatusBoard,
    TransitionReader,
    WeightSource,
    WorkerDirectory,
)
from clusterenv.pipeline.sync.source import RedisWeightSource


@dataclass
class Broker:
    """Everything of the run that lives on the broker, as the roles of pipeline/roles.py."""

    weights: WeightSource  # published versions, probes and reference states
    transitions: TransitionReader  # the chunks the workers wrote
    send: SendTask  # a task to the workers (collection, evaluation)
    workers: WorkerDirectory  # who is alive
    evals: EvalResults  # evaluation results coming back
    flags: RunFlags  # the run's marker and stop key
    status: StatusBoard  # progress for `clusterenv status`
    stop_run: Callable[[str], None]  # mark another run id (a dead learner's) stopped
    close: Callable[[], None] = lambda: None


# Given the arrays every chunk must carry and the action count, the run's broker.
BrokerFactory = Callable[[Mapping[str, ArraySpec], int], Broker]


def redis_broker(url: str, run_id: str, weights: WeightSyncConfig) -> BrokerFactory:
    """The run's broker on the Redis at `url` (tasks through Celery on the same broker)."""

    def make(specs: Mapping[str, ArraySpec], num_actions: int) -> Broker:
        client, keys = connect(url), RunKeys(run_id)
        celery = celery_client(url, "clusterenv-learner")

        def send(name: str, kwargs: dict) -> None:
            celery.send_task(name, kwargs=kwargs)

        return Broker(
            weights=RedisWeightSource(client, keys, ttl_s=weights.weight_ttl_s,
                                      keep=weights.weights_kept),
            # Its own connection: the reader blocks on the stream.
            transitions=StreamReader(connect(url, blocking=True), keys, specs, num_actions),
            send=send,
            workers=WorkerRegistry(client),
            evals=RedisEvalResults(client, keys),
            flags=RedisRunFlags(client, keys),
            status=RedisStatusBoard(client),
            stop_run=lambda other: RedisRunFlags(client, RunKeys(other)).mark_stopped(),
            close=celery.close,
        )  # fmt: skip

    return make
