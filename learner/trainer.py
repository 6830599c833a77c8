"""The learner process, top to bottom: dispatch chunks, train Double DQN, publish, evaluate.

The ingest thread (learner/ingest.py) reads the transition stream into replay. The main thread
turns: take note of arrived chunks and keep the workers busy (dispatch), run up to
`updates_per_turn` gradient steps the rate limiter allows (publishing a version every
`publish_every`), and every `eval_every` env steps ask the workers for a greedy evaluation of the
current weights (learner/evaluation.py), recording each result when it comes back, until a
result reaches the target return or the budget is spent.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from learner.accounting import RunAccounting
from learner.checkpoint import save_checkpoint
from learner.config import TrainConfig
from learner.dqn import DQNLearner
from learner.envs import env_spaces
from learner.evaluation import EvalResult, RemoteEvaluation
from learner.ingest import Ingest
from learner.metrics import MetricsWriter
from learner.progress import Progress
from learner.publisher import Publisher
from learner.rate_limiter import RateLimiter
from learner.replay import ReplayBuffer
from pipeline.chunks.dispatcher import Dispatcher
from pipeline.chunks.stream import StreamReader, transition_specs
from pipeline.cluster.celery_client import celery_client
from pipeline.cluster.registry import WorkerRegistry
from pipeline.connect import connect
from pipeline.keys import RunKeys
from pipeline.sync.source import RedisWeightSource

log = logging.getLogger(__name__)

# Once the run ends, late chunks see `stop` and return at once; the run's keys expire after this.
RUN_KEYS_EXPIRE_S = 3600


@dataclass
class RunResult:
    run_dir: Path
    solved: bool
    env_steps: int
    updates: int
    wall_s: float
    best_eval: float
    evals: list[tuple[int, float]] = field(default_factory=list)


class Trainer:
    def __init__(self, cfg: TrainConfig, redis_url: str, run_dir: Path, run_id: str):
        self.cfg, self.run_dir, self.run_id = cfg, run_dir, run_id
        obs_space, act_space, threshold = env_spaces(cfg.env, cfg.env_kwargs)
        self.target = cfg.target_return if cfg.target_return is not None else threshold
        num_actions = int(act_space.n)
        torch.set_num_threads(cfg.torch_threads)
        self.keys = RunKeys(run_id)
        self.client = connect(redis_url)
        # --- replay, rate limiter and the learner that samples from them ---
        self.replay = ReplayBuffer(cfg.replay.buffer_size, obs_space.shape, obs_space.dtype)
        chunk = cfg.collection.chunk_env_steps
        spi = cfg.replay.samples_per_insert
        self.limiter = RateLimiter(
            spi,
            min_size=cfg.replay.learning_starts,
            # Collection may run ahead of training by a few chunks, so neither side idles on the other.
            error_buffer=spi * chunk * cfg.replay.error_buffer_chunks,
        )
        self.learner = DQNLearner(
            int(np.prod(obs_space.shape)), num_actions, cfg.dqn, self.replay, self.limiter, cfg.seed
        )
        # --- weights out, transitions in ---
        w = cfg.weights
        source = RedisWeightSource(
            self.client, self.keys, ttl_s=w.weight_ttl_s, keep=w.weights_kept
        )
        self.publisher = Publisher(source, self.replay, w, np.random.default_rng([cfg.seed, 1]))
        reader = StreamReader(
            connect(redis_url, blocking=True), self.keys,
            transition_specs(obs_space.dtype, obs_space.shape), num_actions,
        )  # fmt: skip
        self.reader_stats = reader.stats
        self.ingest = Ingest(
            reader, self.replay, self.limiter,
            lambda version: self.publisher.lag(version, self.learner.updates),
        )  # fmt: skip
        # --- dispatch: the chunk requests' fixed fields, sent through Celery ---
        self.celery = celery_client(redis_url, "clusterenv-learner")
        template = {
            "run_id": run_id, "env_id": cfg.env, "env_kwargs": cfg.env_kwargs,
            "num_envs": cfg.collection.envs_per_worker, "steps": cfg.collection.chunk_steps,
            "seed": cfg.seed, "sync": w.sync, "max_lag_versions": w.max_lag_versions,
            "max_lag_seconds": w.max_lag_seconds,
        }  # fmt: skip
        self.dispatcher = Dispatcher(
            lambda name, kwargs: self.celery.send_task(name, kwargs=kwargs),
            WorkerRegistry(self.client).alive_processes, template, chunk, cfg.dispatch,
        )  # fmt: skip
        self.evaluation = RemoteEvaluation(
            self.client, self.keys, lambda name, kwargs: self.celery.send_task(name, kwargs=kwargs),
            cfg.env, cfg.env_kwargs, cfg.evaluation.eval_episodes, seed=cfg.seed + 10**6,
        )  # fmt: skip
        self.accounting = RunAccounting()
        self.metrics = MetricsWriter(run_dir / "metrics.jsonl")

    # --- one turn of the main loop, in three parts ---------------------------------------------
    def collect(self) -> None:
        """Note the chunks that arrived, then keep every live worker process busy."""
        for arrival in self.ingest.arrivals():
            self.dispatcher.arrived(arrival.header["chunk"])
            self.accounting.record(arrival)
        pending = self.dispatcher.pending_env_steps
        self.dispatcher.top_up(
            self.cfg.collection.epsilon(self.accounting.env_steps + pending), self._may_send
        )

    def _may_send(self, pending: int) -> bool:
        if self.accounting.env_steps + pending >= self.cfg.total_steps:
            return False
        return self.limiter.can_insert(self.dispatcher.chunk_env_steps, pending)

    def train(self) -> int:
        """Up to `updates_per_turn` gradient steps, as far as the rate limiter allows."""
        done = 0
        while done < self.cfg.replay.updates_per_turn and self.learner.step():
            done += 1
            if self.learner.updates % self.cfg.weights.publish_every == 0:
                self.publish()
        return done

    def publish(self) -> None:
        self.publisher.publish(self.learner.get_weights(), self.learner.updates)

    def request_eval(self) -> None:
        """Ask the workers to evaluate the current weights (published first if they are new)."""
        if self.publisher.updates_at_version[-1] != self.learner.updates:
            self.publish()
        parts = self.cfg.evaluation.parts(self.dispatcher.slots())
        self.evaluation.request(self.publisher.version, self.accounting.env_steps, parts)

    def _finished_collecting(self) -> bool:
        return self.accounting.env_steps >= self.cfg.total_steps and not self.dispatcher.in_flight

    # --- the run ---------------------------------------------------------------------------------
    def run(self) -> RunResult:
        cfg = self.cfg
        (self.run_dir / "config.json").write_text(cfg.to_json())
        self.publish()  # version 0: workers act with the untrained network
        t0 = time.perf_counter()
        self.ingest.start()
        progress = Progress(cfg.total_steps)
        next_eval, best, solved, interrupted = cfg.evaluation.eval_every, -np.inf, False, False
        evals: list[tuple[int, float]] = []
        last_eval, asked_at = float("nan"), -1  # env steps of the latest evaluation requested
        hits = 0  # consecutive evaluations at or above the target
        try:
            while not solved:
                self.collect()
                trained = self.train()
                steps = self.accounting.env_steps
                out_of_work = self._finished_collecting() and not trained
                if self.evaluation.pending is None and (
                    steps >= next_eval or (out_of_work and asked_at != steps)
                ):
                    next_eval, asked_at = steps + cfg.evaluation.eval_every, steps
                    self.request_eval()
                elif self.evaluation.waiting_s() > cfg.evaluation.eval_timeout_s:
                    log.warning("evaluation of v%d at %d env steps took over %.0f s; given up",
                                self.evaluation.pending.result.version, asked_at,
                                cfg.evaluation.eval_timeout_s)  # fmt: skip
                    self.evaluation.abandon()
                for result in self.evaluation.results():
                    wall = time.perf_counter() - t0
                    last_eval = float(result.returns.mean())
                    best = max(best, last_eval)
                    evals.append((result.env_steps, last_eval))
                    self._log_eval(result, wall)
                    progress.evaluated(result.env_steps, last_eval, result.version, wall)
                    hits = hits + 1 if self.target is not None and last_eval >= self.target else 0
                    solved = hits >= cfg.evaluation.solve_evals
                if out_of_work and self.evaluation.pending is None and asked_at == steps:
                    break
                progress.tick(
                    steps, last_eval, self.publisher.version,
                    lambda: self.accounting.sync_totals().get("weight_fetches", 0),
                )  # fmt: skip
                if not trained:
                    time.sleep(0.002)
        except KeyboardInterrupt:
            interrupted = True  # still write summary and checkpoint below, then re-raise
        finally:
            progress.close()
            self._stop_run()
        wall = time.perf_counter() - t0
        self._finish(wall, solved, interrupted)
        if interrupted:
            raise KeyboardInterrupt
        return RunResult(
            self.run_dir, solved, self.accounting.env_steps, self.learner.updates, wall, best, evals
        )

    def _stop_run(self) -> None:
        """Mark the run stopped (queued chunks return at once), let its keys expire, drain ingest."""
        pipe = self.client.pipeline(transaction=False)
        pipe.set(self.keys.stop, 1, ex=RUN_KEYS_EXPIRE_S)
        for key in (self.keys.stream, self.keys.actor_counter, self.keys.weights_latest):
            pipe.expire(key, RUN_KEYS_EXPIRE_S)
        pipe.execute()
        self.ingest.stop()
        for arrival in self.ingest.arrivals():
            self.accounting.record(arrival)

    def _log_eval(self, result: EvalResult, wall: float) -> None:
        """One metrics row per finished evaluation: `env_steps` and `eval/policy_version` are what
        it was asked about; `wall_s` is when its result reached the learner."""
        acc, returns = self.accounting, result.returns
        row = {
            "env_steps": result.env_steps,
            "wall_s": round(wall, 3),
            "eval/return_mean": float(returns.mean()),
            "eval/return_std": float(returns.std()),
            "eval/policy_version": result.version,
            "eval/latency_s": round(self.evaluation.clock() - result.requested_at, 3),
            "charts/episodic_return": acc.recent_return(),
            "losses/td_loss": self.learner.last_loss,
            "learner/updates": self.learner.updates,
            "learner/policy_version": self.publisher.version,
            "learner/replay_size": self.replay.size,
            "pipeline/chunks": self.reader_stats.chunks,
            "pipeline/duplicates": self.reader_stats.duplicates,
            "pipeline/rejected": self.reader_stats.rejected,
            "pipeline/lost_chunks": self.dispatcher.lost,
            "pipeline/workers": self.dispatcher.slots(),
            **{f"pipeline/{k}": v for k, v in acc.window_lag_stats().items()},
            **{f"pipeline/{k}": v for k, v in acc.sync_totals().items()},
        }
        self.metrics.write(row)

    def _finish(self, wall: float, solved: bool, interrupted: bool) -> None:
        acc = self.accounting
        meta = {"run_id": self.run_id, "env": self.cfg.env, "env_steps": str(acc.env_steps),
                "updates": str(self.learner.updates), "policy_version": str(self.publisher.version)}  # fmt: skip
        save_checkpoint(self.run_dir, "final", self.learner.state_tensors(), meta)
        summary = {
            "run_id": self.run_id,
            "solved": solved,
            "interrupted": interrupted,
            "target_return": self.target,
            "env_steps": acc.env_steps,
            "updates": self.learner.updates,
            "wall_s": round(wall, 3),
            "policy_versions": self.publisher.version + 1,
            "ingest": vars(self.reader_stats),
            "ingest_cpu_fraction": round(self.ingest.cpu_s / max(wall, 1e-9), 4),
            "lost_chunks": self.dispatcher.lost,
            "sync_rule": self.cfg.weights.sync,
            **acc.summary(),
        }
        (self.run_dir / "summary.json").write_text(json.dumps(summary, indent=2))
        self.metrics.close()
        self.celery.close()
