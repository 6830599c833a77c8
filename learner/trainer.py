"""The learner process, top to bottom: dispatch chunks, train (DQN or PPO), publish, evaluate.

The ingest thread (learner/ingest.py) reads the transition stream into the learner (DQN's replay,
PPO's chunk queue; learner/algorithm.py). The main thread turns: take note of arrived chunks and
keep the workers busy (dispatch), run up to `updates_per_turn` learner updates the data allows
(publishing a version every `publish_every`; every update for PPO), and every `eval_every` env steps ask the workers for a greedy evaluation of the
current weights (learner/evaluation.py), recording each result when it comes back, until a
result reaches the target return or the budget is spent. Every `checkpoint_every_s` seconds (or
`checkpoint_every_updates`) it writes a checkpoint that `--resume` continues from (learner/state.py).
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import numpy as np
import redis
import torch
from kombu.exceptions import OperationalError

from clusterenv.learner.accounting import RunAccounting, id_ranges
from clusterenv.learner.algorithm import build_algorithm
from clusterenv.learner.best import BestKeeper
from clusterenv.learner.checkpoint import Checkpoints, save_checkpoint
from clusterenv.learner.config import TrainConfig
from clusterenv.learner.envs import env_spaces
from clusterenv.learner.evaluation import EvalResult, RemoteEvaluation
from clusterenv.learner.ingest import Ingest
from clusterenv.learner.metrics import MetricsWriter
from clusterenv.learner.progress import Progress
from clusterenv.learner.publisher import Publisher
from clusterenv.learner.resume import Resumed, record_run_id, record_version
from clusterenv.learner.state import checkpoint, mark_started, mark_stopped, resume_run
from clusterenv.learner.status import RunStatus
from clusterenv.pipeline.chunks.dispatcher import Dispatcher
from clusterenv.pipeline.chunks.stream import StreamReader
from clusterenv.pipeline.cluster.celery_client import celery_client
from clusterenv.pipeline.cluster.registry import WorkerRegistry
from clusterenv.pipeline.connect import connect
from clusterenv.pipeline.keys import RunKeys
from clusterenv.pipeline.spaces import SpaceSpecs
from clusterenv.pipeline.sync.source import RedisWeightSource

log = logging.getLogger(__name__)


class RunFailed(RuntimeError):
    """The run cannot go on (ingest died, the broker is gone); the message says why."""

    def __init__(self, message: str, broker_gone: bool = False):
        super().__init__(message)
        self.broker_gone = broker_gone


def configure_torch(threads: int) -> None:
    """The learner thread's torch: `threads` intra-op threads, subnormal floats flushed to zero."""
    torch.set_num_threads(threads)
    # Adam's first moment of a weight whose gradient stays zero (a ReLU unit silent over the batch)
    # shrinks by beta1 each step into subnormal floats, and arithmetic on those is many times
    # slower on x86: in bench/update_cost.py two thirds of the second layer's moments were
    # subnormal after 2,000 steps, and flushing them to zero made a step 2.1-2.4 -> 1.6 ms
    # (docs/benchmarks.md, "Gradient step"). The flag is per thread: the gradient step runs in the
    # thread that builds the Trainer.
    torch.set_flush_denormal(True)


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
    def __init__(self, cfg: TrainConfig, redis_url: str, run_dir: Path, run_id: str,
                 resume: Resumed | None = None):  # fmt: skip
        self.cfg, self.run_dir, self.run_id = cfg, run_dir, run_id
        obs_space, act_space, threshold = env_spaces(cfg.env, cfg.env_kwargs)
        self.target = cfg.target_return if cfg.target_return is not None else threshold
        num_actions = int(act_space.n)
        configure_torch(cfg.torch_threads)
        self.keys = RunKeys(run_id)
        self.client = connect(redis_url)

        def lag(version: int) -> tuple[int, int]:
            """(versions, updates) behind the learner: the publisher and learner are made below."""
            return self.publisher.lag(version, self.learner.updates)

        # --- the algorithm: its learner (behind one interface) and what the workers must do ---
        self.algo = build_algorithm(cfg, obs_space, num_actions, lambda v: lag(v)[0])
        self.learner = self.algo.learner
        self.replay, self.limiter = self.learner.replay, self.learner.limiter
        chunk = cfg.collection.chunk_env_steps
        # --- weights out, transitions in ---
        w = cfg.weights
        source = RedisWeightSource(
            self.client, self.keys, ttl_s=w.weight_ttl_s, keep=w.weights_kept
        )
        rng = np.random.default_rng([cfg.seed, 1])
        self.publisher = Publisher(source, self.replay, w, rng, partial(record_version, run_dir))
        reader = StreamReader(
            connect(redis_url, blocking=True), self.keys, SpaceSpecs.of(obs_space, act_space),
            self.algo.extra_specs,
        )  # fmt: skip
        self.reader_stats, self.accepted_chunks = reader.stats, reader.seen
        # A chunk a reader took and never acked is claimed when the dispatcher writes it off.
        self.ingest = Ingest(reader, self.learner.insert, lag, cfg.dispatch.lost_after_s)
        # --- dispatch and evaluation: tasks sent through Celery ---
        self.celery = celery_client(redis_url, "clusterenv-learner")

        def send(name: str, kwargs: dict) -> None:
            self.celery.send_task(name, kwargs=kwargs)

        template = {
            "run_id": run_id, "env_id": cfg.env, "env_kwargs": cfg.env_kwargs,
            "num_envs": cfg.collection.envs_per_worker, "steps": cfg.collection.chunk_steps,
            "seed": cfg.seed, "sync": w.sync, "max_lag_versions": self.algo.max_lag_versions,
            "max_lag_seconds": w.max_lag_seconds,
        }  # fmt: skip
        self.dispatcher = Dispatcher(
            send, WorkerRegistry(self.client).alive_processes, template, chunk, cfg.dispatch,
        )  # fmt: skip
        self.evaluation = RemoteEvaluation(
            self.client, self.keys, send, cfg.env, cfg.env_kwargs, cfg.evaluation.eval_episodes, seed=cfg.seed,
        )  # fmt: skip
        self.accounting = RunAccounting()
        self.status = RunStatus(self.client, self.keys, cfg.env)  # for `clusterenv status`
        # --- the run's progress: evaluations asked for and their results ---
        self.next_eval, self.asked_at = cfg.evaluation.eval_every, -1  # env steps
        self.evals: list[tuple[int, float]] = []  # (env steps, mean return) per evaluation
        self.hits, self.solved = 0, False  # consecutive evaluations at the target; solved yet
        self.best = BestKeeper(run_dir)  # best.safetensors: the best-evaluated network so far
        self._checked_at = time.monotonic()
        self._chunks_at_eval_request = 0
        self.checkpoints = Checkpoints(run_dir, cfg.checkpoint)
        self.wall_before, self.resumed = 0.0, resume  # wall seconds of the learners before
        if resume is not None:
            resume_run(self, resume)

    # --- the parts of one turn of the main loop ------------------------------------------------
    def collect(self) -> None:
        """Note the chunks that arrived, then keep every live worker process busy."""
        for arrival in self.ingest.arrivals():
            self.dispatcher.arrived(arrival.header["chunk"])
            self.accounting.record(arrival)
        pending = self.dispatcher.pending_env_steps
        self.dispatcher.top_up(
            self.algo.behaviour(self.accounting.env_steps + pending), self._may_send
        )

    def _may_send(self, pending: int) -> bool:
        if self.accounting.env_steps + pending >= self.cfg.total_steps:
            return False
        return self.limiter.can_insert(self.dispatcher.task_env_steps, pending)

    def train(self) -> int:
        """Up to `updates_per_turn` learner updates, as far as the data (rate limiter, PPO's queue)
        allows."""
        lr = self.algo.lr(self.accounting.env_steps)
        for group in self.learner.optimizer.param_groups:
            group["lr"] = lr
        done = 0
        while done < self.cfg.replay.updates_per_turn and self.learner.step():
            done += 1
            if self.learner.updates % self.algo.publish_every == 0:
                self.publish()
        return done

    def publish(self) -> None:
        self.publisher.publish(self.learner.get_weights(), self.learner.updates)

    def request_eval(self) -> None:
        """Ask the workers to evaluate the current weights (published first if they are new)."""
        weights = self.learner.get_weights()
        if self.publisher.updates_at_version.get(self.publisher.version) != self.learner.updates:
            self.publisher.publish(weights, self.learner.updates)
        parts = self.cfg.evaluation.parts(self.dispatcher.slots())
        self.evaluation.request(self.publisher.version, self.accounting.env_steps, parts)
        self.best.asked(self.publisher.version, weights)
        self._chunks_at_eval_request = self.reader_stats.chunks

    def schedule_eval(self, out_of_work: bool) -> None:
        """Every `eval_every` env steps, and once more when the budget is spent: one request at
        a time; an evaluation older than `eval_timeout_s`, or one of whose parts was taken by a
        worker that is gone, is given up."""
        ev, steps = self.cfg.evaluation, self.accounting.env_steps
        if self.evaluation.pending is None:
            if steps >= self.next_eval or (out_of_work and self.asked_at != steps):
                self.next_eval, self.asked_at = steps + ev.eval_every, steps
                self.request_eval()
        elif self.evaluation.waiting_s() > ev.eval_timeout_s:
            log.warning("evaluation of v%d at %d env steps took over %.0f s; given up",
                        self.evaluation.pending.result.version, self.asked_at, ev.eval_timeout_s)  # fmt: skip
            self.evaluation.abandon()
        elif (gone := self.evaluation.lost_to()) is not None:
            log.warning("evaluation of v%d at %d env steps: worker %s is gone; given up",
                        self.evaluation.pending.result.version, self.asked_at, gone)  # fmt: skip
            self.evaluation.abandon()

    def record_evals(self) -> None:
        """Log each finished evaluation; `solve_evals` consecutive ones at the target solve it."""
        for result in self.evaluation.results():
            wall = time.perf_counter() - self.t0
            mean = float(result.returns.mean())
            self.evals.append((result.env_steps, mean))
            self._log_eval(result, wall)
            self.progress.evaluated(result.env_steps, mean, result.version, wall)
            self.best.evaluated(result, mean)
            self.hits = self.hits + 1 if self.target is not None and mean >= self.target else 0
            self.solved = self.solved or self.hits >= self.cfg.evaluation.solve_evals

    def check_health(self) -> None:
        """Stop on a dead ingest thread; give a broker that lost the run's state (a restart
        without persistence) its weights again and re-dispatch what it lost. Once a second."""
        error = self.ingest.error
        if error is not None:
            raise RunFailed(
                f"ingest failed: {type(error).__name__}: {error}",
                broker_gone=isinstance(error, redis.ConnectionError | redis.TimeoutError),
            )
        now = time.monotonic()
        if now - self._checked_at < 1.0:
            return
        self._checked_at = now
        # Not `weights:latest`: the learner's own next publish may re-create it before this check.
        if self.client.exists(self.keys.marker):
            return
        mark_started(self.client, self.keys)
        lost = self.dispatcher.write_off_in_flight()
        self.evaluation.abandon()
        self.publisher.publish(self.learner.get_weights(), self.learner.updates, new_reference=True)
        self.accounting.broker_recoveries += 1
        log.warning("the broker lost this run's state (restarted?): published v%d again, "
                    "re-dispatching %d chunks", self.publisher.version, lost)  # fmt: skip

    def _finished_collecting(self) -> bool:
        return self.accounting.env_steps >= self.cfg.total_steps and not self.dispatcher.in_flight

    def turn(self) -> bool:
        """One turn of the main loop; False once the run is over."""
        self.check_health()
        self.collect()
        trained = self.train()
        if self.checkpoints.due(self.learner.updates):
            checkpoint(self)
        out_of_work = self._finished_collecting() and not trained
        self.schedule_eval(out_of_work)
        self.record_evals()
        steps = self.accounting.env_steps
        if self.solved or (
            out_of_work and self.evaluation.pending is None and self.asked_at == steps
        ):
            return False
        self.progress.tick(
            steps, self.evals[-1][1] if self.evals else float("nan"), self.publisher.version,
            lambda: self.accounting.sync_totals().get("weight_fetches", 0),
        )  # fmt: skip
        if not trained:
            time.sleep(0.002)
        return True

    # --- the run ---------------------------------------------------------------------------------
    def run(self) -> RunResult:
        """Train until solved or out of budget. KeyboardInterrupt (also SIGTERM/SIGHUP via the CLI)
        and RunFailed still write the summary and the final checkpoint before they propagate."""
        cfg = self.cfg
        self.t0 = time.perf_counter() - self.wall_before
        self.progress = Progress(cfg.total_steps, cfg.status_every_s, self.status)
        interrupted, failure = False, None
        # metrics.jsonl appears here, and from here on a signal still ends with a summary and a
        # final checkpoint (the start-up below is inside the try).
        self.metrics = MetricsWriter(self.run_dir / "metrics.jsonl")
        try:
            (self.run_dir / "config.json").write_text(cfg.to_json())
            record_run_id(self.run_dir, self.run_id)
            mark_started(self.client, self.keys)
            self.publish()  # the first version: workers act with the untrained (or resumed) network
            self.ingest.start()
            while self.turn():
                pass
        except KeyboardInterrupt:
            interrupted = True
        except RunFailed as exc:
            failure = exc
        except (redis.RedisError, OperationalError) as exc:  # past the clients' own retries
            failure = RunFailed(
                f"broker unreachable: {type(exc).__name__}: {exc}", broker_gone=True
            )
        finally:
            self.progress.close()
            self._stop_run(broker_gone=failure is not None and failure.broker_gone)
        wall = time.perf_counter() - self.t0
        self._finish(wall, self.solved, interrupted, failure)
        if interrupted:
            raise KeyboardInterrupt
        if failure is not None:
            raise failure
        best = max((m for _, m in self.evals), default=-np.inf)
        return RunResult(
            self.run_dir, self.solved, self.accounting.env_steps, self.learner.updates, wall, best,
            self.evals,
        )  # fmt: skip

    def _stop_run(self, broker_gone: bool = False) -> None:
        """Mark the run stopped (queued chunks return at once), let its keys expire, drain ingest;
        on a broker known to be gone (its clients would retry for half a minute), only the last."""
        if not broker_gone:
            try:
                mark_stopped(self.client, self.keys)
            except redis.RedisError as exc:  # a broker that is gone keeps nothing to clean up
                log.warning("could not mark the run stopped on the broker: %s", exc)
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
            # Collection goes on while the workers evaluate: chunks accepted meanwhile.
            "eval/chunks_meanwhile": self.reader_stats.chunks - self._chunks_at_eval_request,
            "charts/episodic_return": acc.recent_return(),
            **self.learner.metrics(),
            "learner/updates": self.learner.updates,
            "learner/lr": self.learner.optimizer.param_groups[0]["lr"],
            "learner/policy_version": self.publisher.version,
            "pipeline/chunks": self.reader_stats.chunks,
            "pipeline/duplicates": self.reader_stats.duplicates,
            "pipeline/rejected": self.reader_stats.rejected,
            "pipeline/lost_chunks": self.dispatcher.lost,
            "pipeline/workers": self.dispatcher.slots(),
            **{f"pipeline/{k}": v for k, v in acc.window_lag_stats().items()},
            **{f"pipeline/{k}": v for k, v in acc.sync_totals().items()},
        }
        self.metrics.write(row)

    def _finish(
        self, wall: float, solved: bool, interrupted: bool, failure: RunFailed | None
    ) -> None:
        acc = self.accounting
        meta = {"run_id": self.run_id, "env": self.cfg.env, "env_steps": str(acc.env_steps),
                "updates": str(self.learner.updates), "policy_version": str(self.publisher.version)}  # fmt: skip
        save_checkpoint(self.run_dir, "final", self.learner.state_tensors(), meta)
        checkpoint(self)  # an interrupted or failed run resumes from where it stopped
        summary = {
            "run_id": self.run_id,
            "resumed_from": str(self.resumed.checkpoint) if self.resumed is not None else None,
            "solved": solved,
            "interrupted": interrupted,
            "failed": str(failure) if failure is not None else None,
            "target_return": self.target,
            "env_steps": acc.env_steps,
            "updates": self.learner.updates,
            "wall_s": round(wall, 3),
            "policy_versions": self.publisher.version + 1,
            "ingest": vars(self.reader_stats),
            "ingest_retries": self.ingest.retried,
            "ingest_cpu_fraction": round(self.ingest.cpu_s / max(wall, 1e-9), 4),
            "lost_chunks": self.dispatcher.lost,
            "late_chunks": self.dispatcher.late,
            # Which chunk ids reached replay, each once: the evidence a fault test checks.
            "accepted_chunk_ids": id_ranges(self.accepted_chunks),
            "broker_recoveries": acc.broker_recoveries,
            "best": self.best.chosen,  # what best.safetensors holds: eval mean, env steps, version
            "sync_rule": self.cfg.weights.sync,
            "algo": self.cfg.algo,
            "learner": self.learner.metrics(),
            **acc.summary(),
        }
        (self.run_dir / "summary.json").write_text(json.dumps(summary, indent=2))
        if failure is None or not failure.broker_gone:
            self.status.finish(summary)
        self.metrics.close()
        self.celery.close()
