"""The run's wiring, in one place: every part of a run built and connected (`wire`), the roles it
talks to the broker through (`Broker`), and their Redis and Celery implementations
(`redis_broker`). Tests hand `wire` in-process fakes of the same roles (tests/inprocess.py), so the
loop (learner/run/loop.py) runs without a server."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from prometheus_client import CollectorRegistry

from clusterenv.learner.agents import build_agent
from clusterenv.learner.config import TrainConfig, WeightSyncConfig
from clusterenv.learner.core.agent import Agent
from clusterenv.learner.persistence.best import BestKeeper
from clusterenv.learner.persistence.checkpoint import Checkpoints
from clusterenv.learner.persistence.resume import record_version
from clusterenv.learner.run.accounting import RunAccounting
from clusterenv.learner.run.evaluation import EvalSchedule, RemoteEvaluation
from clusterenv.learner.run.ingest import Ingest
from clusterenv.learner.run.prometheus import RunGauges
from clusterenv.learner.run.publisher import Publisher, ReferencePool
from clusterenv.learner.run.records import RunRecords
from clusterenv.learner.run.status import RunStatus
from clusterenv.learner.spaces import env_spaces
from clusterenv.pipeline.chunks.dispatcher import Dispatcher
from clusterenv.pipeline.chunks.stream import StreamReader
from clusterenv.pipeline.chunks.takers import RedisChunkTakers
from clusterenv.pipeline.cluster.celery_client import celery_client
from clusterenv.pipeline.cluster.registry import WorkerRegistry
from clusterenv.pipeline.cluster.run_flags import RedisRunFlags
from clusterenv.pipeline.cluster.status_board import RedisStatusBoard
from clusterenv.pipeline.codec import ArraySpec
from clusterenv.pipeline.connect import connect
from clusterenv.pipeline.evaluation.results import RedisEvalResults
from clusterenv.pipeline.keys import RunKeys
from clusterenv.pipeline.roles import (
    ChunkTakers,
    EvalResults,
    RunFlags,
    SendTask,
    StatusBoard,
    TransitionReader,
    WeightSource,
    WorkerDirectory,
)
from clusterenv.pipeline.spaces import BoxActions, SpaceSpecs
from clusterenv.pipeline.sync.source import RedisWeightSource, reference_pool_rows


@dataclass
class Broker:
    """Everything of the run that lives on the broker, as the roles of pipeline/roles.py."""

    weights: WeightSource  # published versions, probes and reference states
    transitions: TransitionReader  # the chunks the workers wrote
    send: SendTask  # a task to the workers (collection, evaluation)
    workers: WorkerDirectory  # who is alive
    takers: ChunkTakers  # which worker took which chunk
    evals: EvalResults  # evaluation results coming back
    flags: RunFlags  # the run's marker and stop key
    status: StatusBoard  # progress for `clusterenv status`
    stop_run: Callable[[str], None]  # mark another run id (a dead learner's) stopped
    close: Callable[[], None] = lambda: None


# Given the env's spaces on the wire and the arrays the agent adds to every chunk, the run's broker.
BrokerFactory = Callable[[SpaceSpecs, Mapping[str, ArraySpec]], Broker]


def redis_broker(url: str, run_id: str, weights: WeightSyncConfig) -> BrokerFactory:
    """The run's broker on the Redis at `url` (tasks through Celery on the same broker)."""

    def make(spaces: SpaceSpecs, extra: Mapping[str, ArraySpec]) -> Broker:
        client, keys = connect(url), RunKeys(run_id)
        celery = celery_client(url, "clusterenv-learner")

        def send(name: str, kwargs: dict) -> None:
            celery.send_task(name, kwargs=kwargs)

        return Broker(
            weights=RedisWeightSource(client, keys, ttl_s=weights.weight_ttl_s,
                                      keep=weights.weights_kept),
            # Its own connection: the reader blocks on the stream.
            transitions=StreamReader(connect(url, blocking=True), keys, spaces, extra),
            send=send,
            workers=WorkerRegistry(client),
            takers=RedisChunkTakers(client, keys),
            evals=RedisEvalResults(client, keys),
            flags=RedisRunFlags(client, keys),
            status=RedisStatusBoard(client),
            stop_run=lambda other: RedisRunFlags(client, RunKeys(other)).mark_stopped(),
            close=celery.close,
        )  # fmt: skip

    return make


def configure_torch(threads: int) -> None:
    """The learner thread's torch: `threads` intra-op threads, subnormal floats flushed to zero."""
    torch.set_num_threads(threads)
    # Adam's first moment of a weight whose gradient stays zero (a ReLU unit silent over the batch)
    # shrinks by beta1 each step into subnormal floats, and arithmetic on those is many times
    # slower on x86: in bench/update_cost.py two thirds of the second layer's moments were
    # subnormal after 2,000 steps, and flushing them to zero made a step 2.1-2.4 -> 1.6 ms
    # (docs/benchmarks.md, "Gradient step"). The flag is per thread: the gradient step runs in the
    # thread that wires the run.
    torch.set_flush_denormal(True)


@dataclass
class RunParts:
    """Everything a run is made of, connected; the loop (learner/run/loop.py) turns them."""

    cfg: TrainConfig
    run_dir: Path
    run_id: str
    agent: Agent  # the agent's learner behind one interface, and what the workers must do
    broker: Broker
    pool: ReferencePool  # the newest accepted observations: reference states' source
    publisher: Publisher  # weights out
    ingest: Ingest  # transitions in
    dispatcher: Dispatcher  # collection tasks out
    evaluation: RemoteEvaluation  # evaluation tasks out, results in
    schedule: EvalSchedule  # when to evaluate; what the results say
    accounting: RunAccounting
    status: RunStatus  # for `clusterenv status`
    best: BestKeeper  # best.safetensors: the best-evaluated network so far
    records: RunRecords  # metrics.jsonl, TensorBoard, summary.json
    checkpoints: Checkpoints
    gauges: RunGauges | None = None  # Prometheus figures, when a metrics server serves them


def wire(cfg: TrainConfig, broker_for: BrokerFactory, run_dir: Path, run_id: str,
         metrics: CollectorRegistry | None = None) -> RunParts:  # fmt: skip
    """Build a run's parts for `cfg` on the broker `broker_for` makes; with `metrics`, the run's
    Prometheus figures are registered there."""
    configure_torch(cfg.torch_threads)
    spaces, threshold = env_spaces(cfg.env, cfg.env_kwargs, cfg.algo)
    late: dict[str, Any] = {}  # the publisher, for the lag of a version: made after the agent

    def lag(version: int) -> tuple[int, int]:
        """(versions, updates) the policy `version` is behind the learner."""
        return late["publisher"].lag(version, agent.learner.updates)

    agent = build_agent(cfg, spaces, lambda v: lag(v)[0])
    broker = broker_for(spaces, agent.extra_specs)
    # --- weights out, transitions in ---
    w = cfg.weights
    pool = ReferencePool(reference_pool_rows(w.reference_size))
    late["publisher"] = publisher = Publisher(
        broker.weights, pool, w, np.random.default_rng([cfg.seed, 1]),
        lambda version: record_version(run_dir, version),
        agent.value_probe if cfg.sync_measure(isinstance(spaces.action, BoxActions)) == "value"
        else None,
    )  # fmt: skip

    def store(header: dict[str, Any], arrays: dict[str, np.ndarray]) -> int:
        """The ingest thread's sink: a chunk into the learner, its observations into the pool."""
        pool.add(arrays)
        return agent.learner.insert(header, arrays)

    # A chunk a reader took and never acked is claimed when the dispatcher writes it off.
    ingest = Ingest(broker.transitions, store, lag, cfg.dispatch.lost_after_s)
    # --- dispatch and evaluation: tasks sent to the workers ---
    template = {
        "run_id": run_id, "env_id": cfg.env, "env_kwargs": cfg.env_kwargs,
        "num_envs": cfg.collection.envs_per_worker, "steps": cfg.collection.chunk_steps,
        "seed": cfg.seed, "sync": w.sync, "max_lag_versions": agent.max_lag_versions,
        "max_lag_seconds": w.max_lag_seconds, "time_limit_s": cfg.chunk_time_limit_s(),
        **agent.task_fields,
    }  # fmt: skip
    dispatcher = Dispatcher(broker.send, broker.workers.alive_processes, template,
                            cfg.collection.chunk_env_steps, cfg.dispatch)  # fmt: skip
    # A worker cuts a hung evaluation off before the learner would give it up.
    evaluation = RemoteEvaluation(run_id, broker.evals, broker.workers, broker.send, cfg.env,
                                  cfg.env_kwargs, cfg.evaluation.eval_episodes, seed=cfg.seed,
                                  time_limit_s=cfg.evaluation.eval_timeout_s * 2 / 3)  # fmt: skip
    target = cfg.target_return if cfg.target_return is not None else threshold
    accounting, best = RunAccounting(), BestKeeper(run_dir)
    gauges = None
    if metrics is not None:
        gauges = RunGauges({"run_id": run_id, "env": cfg.env, "algo": cfg.algo})
        metrics.register(gauges)
    return RunParts(
        cfg, run_dir, run_id, agent, broker, pool, publisher, ingest, dispatcher, evaluation,
        EvalSchedule(cfg.evaluation, evaluation, target), accounting,
        RunStatus(broker.status, run_id, cfg.env), best,
        RunRecords(run_dir, agent.learner, publisher, accounting, ingest, dispatcher, evaluation, best),
        Checkpoints(run_dir, cfg.checkpoint), gauges,
    )  # fmt: skip
