"""The learner process, top to bottom: ingest chunks, train Double DQN, publish weights, evaluate.

One ingest thread reads the transition stream into replay; the main thread dispatches chunks,
trains at the samples-per-insert ratio, publishes a weight version every `publish_every`
updates, and evaluates greedily every `eval_every` env steps until the target or the budget.
"""

from __future__ import annotations

import json
import logging
import queue
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from celery import Celery
from tqdm import tqdm

from learner.checkpoint import save_checkpoint
from learner.config import TrainConfig
from learner.dqn import DQNLearner
from learner.evaluation import Evaluator
from learner.metrics import MetricsWriter
from learner.rate_limiter import RateLimiter
from learner.replay import ReplayBuffer
from pipeline.connect import connect
from pipeline.dispatcher import Dispatcher
from pipeline.keys import RunKeys
from pipeline.policy import NumpyMLP
from pipeline.stream import TransitionReader, transition_specs
from pipeline.weights import WeightSource

log = logging.getLogger(__name__)

UPDATES_PER_TURN = 16  # gradient steps between looks at dispatch, arrivals and eval


@dataclass
class Arrival:
    """What the ingest thread tells the main thread about one accepted chunk."""

    header: dict[str, Any]
    transitions: int
    lag_versions: int
    lag_updates: int


@dataclass
class RunResult:
    run_dir: Path
    solved: bool
    env_steps: int
    updates: int
    wall_s: float
    best_eval: float
    evals: list[tuple[int, float]] = field(default_factory=list)


def env_spaces(cfg: TrainConfig) -> tuple[gym.spaces.Box, gym.spaces.Discrete, float | None]:
    """Observation space, action space and reward threshold; ValueError if unusable for DQN."""
    try:
        env = gym.make(cfg.env, **cfg.env_kwargs)
    except gym.error.Error as exc:
        raise ValueError(f"--env {cfg.env!r}: {exc}") from None
    except TypeError as exc:
        raise ValueError(f"--env-kwargs for {cfg.env!r}: {exc}") from None
    try:
        obs_space, act_space = env.observation_space, env.action_space
        if not isinstance(act_space, gym.spaces.Discrete):
            raise ValueError(
                f"--env {cfg.env!r}: DQN needs a Discrete action space, not {act_space}"
            )
        if not isinstance(obs_space, gym.spaces.Box):
            raise ValueError(f"--env {cfg.env!r}: needs a Box observation space, not {obs_space}")
        return obs_space, act_space, env.spec.reward_threshold if env.spec else None
    finally:
        env.close()


class Trainer:
    def __init__(self, cfg: TrainConfig, redis_url: str, run_dir: Path, run_id: str):
        self.cfg, self.run_dir, self.run_id = cfg, run_dir, run_id
        obs_space, act_space, threshold = env_spaces(cfg)
        self.target = cfg.target_return if cfg.target_return is not None else threshold
        self.num_actions = int(act_space.n)
        torch.set_num_threads(cfg.torch_threads)
        self.rng = np.random.default_rng(cfg.seed)
        self.keys = RunKeys(run_id)
        self.client = connect(redis_url)
        self.replay = ReplayBuffer(cfg.buffer_size, obs_space.shape, obs_space.dtype)
        chunk_env_steps = cfg.envs_per_worker * cfg.chunk_steps
        self.limiter = RateLimiter(
            cfg.samples_per_insert,
            min_size=cfg.learning_starts,
            # Collection may run ahead of training by a few chunks, so neither side idles on the other.
            error_buffer=cfg.samples_per_insert * chunk_env_steps * 4,
        )
        self.learner = DQNLearner(
            int(np.prod(obs_space.shape)), self.num_actions, cfg.hidden_sizes(), cfg.lr, cfg.gamma,
            cfg.target_update_every, cfg.max_grad_norm, cfg.seed,
        )  # fmt: skip
        self.source = WeightSource(self.client, self.keys)
        self.reader = TransitionReader(
            connect(redis_url, blocking=True), self.keys,
            transition_specs(obs_space.dtype, obs_space.shape), self.num_actions,
        )  # fmt: skip
        app = Celery("clusterenv-learner")
        app.config_from_object("celeryconfig")
        app.conf.broker_url = redis_url
        self.app = app
        template = {
            "run_id": run_id, "env_id": cfg.env, "env_kwargs": cfg.env_kwargs,
            "num_envs": cfg.envs_per_worker, "steps": cfg.chunk_steps, "seed": cfg.seed, "sync": cfg.sync,
            "max_lag_versions": cfg.max_lag_versions, "max_lag_s": cfg.max_lag_seconds,
        }  # fmt: skip
        self.dispatcher = Dispatcher(app, self.client, template, chunk_env_steps)
        self.evaluator = Evaluator(
            cfg.env, cfg.env_kwargs, cfg.eval_episodes, seed=cfg.seed + 10**6
        )
        self.metrics = MetricsWriter(run_dir / "metrics.jsonl")
        self.arrivals: queue.SimpleQueue[Arrival] = queue.SimpleQueue()
        self.env_steps = 0
        self.worker_sync: dict[str, dict[str, int]] = {}
        self.lags: list[int] = []
        self.lag_updates: list[int] = []
        self.divergences: list[tuple[float, int]] = []  # (D, index of its chunk in self.lags)
        self._lag_mark = 0  # chunks already covered by a previous metrics row
        self.updates_at_version: list[int] = []
        self.episode_returns: list[float] = []
        self._stop_ingest = threading.Event()
        self.ingest_cpu_s = 0.0

    # --- ingest thread --------------------------------------------------------------------------
    def _sink(self, header: dict[str, Any], arrays: dict[str, np.ndarray]) -> None:
        a = arrays
        self.replay.add(a["obs"], a["action"], a["reward"], a["next_obs"], a["terminated"])
        self.limiter.on_insert(len(a["action"]))
        behaviour = header["policy_version"]
        lag = self.source.version - behaviour
        known = 0 <= behaviour < len(self.updates_at_version)
        lag_updates = self.learner.updates - self.updates_at_version[behaviour] if known else 0
        self.arrivals.put(Arrival(header, len(a["action"]), lag, lag_updates))

    def _ingest(self) -> None:
        try:
            while not self._stop_ingest.is_set():
                self.reader.poll(self._sink, block_ms=50)
        finally:
            self.ingest_cpu_s = time.thread_time()

    # --- main thread ----------------------------------------------------------------------------
    def _drain_arrivals(self) -> None:
        while True:
            try:
                arr = self.arrivals.get_nowait()
            except queue.Empty:
                return
            h = arr.header
            self.dispatcher.arrived(h["chunk"])
            self.env_steps += int(h.get("env_steps", arr.transitions))
            self.lags.append(arr.lag_versions)
            self.lag_updates.append(arr.lag_updates)
            if isinstance(h.get("divergence"), float):
                self.divergences.append((h["divergence"], len(self.lags) - 1))
            if isinstance(h.get("sync"), dict):
                self.worker_sync[h["worker"]] = h["sync"]
            self.episode_returns.extend(float(r) for r, _ in h.get("episodes", []))

    def sync_totals(self) -> dict[str, int]:
        totals: dict[str, int] = {}
        for counters in self.worker_sync.values():
            for k, v in counters.items():
                totals[k] = totals.get(k, 0) + int(v)
        return totals

    def _may_send(self, pending: int) -> bool:
        if self.env_steps + pending >= self.cfg.total_steps:
            return False
        return self.limiter.can_insert(self.dispatcher.chunk_env_steps, pending)

    def _train_turn(self) -> int:
        done = 0
        while done < UPDATES_PER_TURN and self.limiter.can_sample(self.cfg.batch_size):
            batch = self.replay.sample(self.cfg.batch_size, self.rng)
            self.last_loss = self.learner.step(batch)
            self.limiter.on_sample(self.cfg.batch_size)
            done += 1
            if self.learner.updates % self.cfg.publish_every == 0:
                self._publish()
        return done

    def _publish(self) -> None:
        """A new weight version with its probe: the same numpy forward the workers run, so
        identical weights give a divergence of exactly zero."""
        cfg = self.cfg
        weights = self.learner.get_weights()
        probe = None
        if self.replay.size >= cfg.reference_size:
            if (
                self.source.reference is None
                or (self.source.version + 1) % cfg.reference_every == 0
            ):
                recent = self.replay.recent_obs(10 * cfg.reference_size)
                pick = self.rng.choice(len(recent), size=cfg.reference_size, replace=False)
                self.source.publish_reference(
                    recent[pick].reshape(cfg.reference_size, -1).astype(np.float32)
                )
            probe = NumpyMLP(weights)(self.source.reference)
        self.updates_at_version.append(self.learner.updates)
        self.source.publish(weights, probe)

    def _finished_collecting(self) -> bool:
        return self.env_steps >= self.cfg.total_steps and not self.dispatcher.in_flight

    def run(self) -> RunResult:
        cfg = self.cfg
        (self.run_dir / "config.json").write_text(cfg.to_json())
        self._publish()
        ingest = threading.Thread(target=self._ingest, name="ingest", daemon=True)
        t0 = time.perf_counter()
        ingest.start()
        interactive = sys.stderr.isatty()
        bar = tqdm(total=cfg.total_steps, unit="step", dynamic_ncols=True, disable=not interactive)
        next_eval, best, solved = cfg.eval_every, -np.inf, False
        evals: list[tuple[int, float]] = []
        last_eval = float("nan")
        interrupted = False
        self.last_loss = float("nan")
        try:
            while True:
                self._drain_arrivals()
                self.dispatcher.top_up(
                    cfg.epsilon(self.env_steps + self.dispatcher.pending_env_steps), self._may_send
                )
                trained = self._train_turn()
                if self.env_steps >= next_eval or (self._finished_collecting() and not trained):
                    next_eval = self.env_steps + cfg.eval_every
                    returns = self.evaluator.run(self.learner.get_weights())
                    last_eval = float(returns.mean())
                    best = max(best, last_eval)
                    evals.append((self.env_steps, last_eval))
                    wall = time.perf_counter() - t0
                    self._log_eval(returns, wall)
                    if not interactive:
                        print(
                            f"steps {self.env_steps:>7d}  eval {last_eval:7.1f}  "
                            f"v{self.source.version}  {wall:6.1f}s", file=sys.stderr, flush=True,
                        )  # fmt: skip
                    if self.target is not None and last_eval >= self.target:
                        solved = True
                        break
                    if self._finished_collecting() and not trained:
                        break
                if interactive:  # the postfix sums every worker's counters: only for a bar
                    bar.n = min(self.env_steps, cfg.total_steps)
                    bar.set_postfix(
                        sps=f"{self.env_steps / max(1e-9, time.perf_counter() - t0):.0f}",
                        eval=f"{last_eval:.0f}", v=self.source.version,
                        fetches=self.sync_totals().get("weight_fetches", 0), refresh=False,
                    )  # fmt: skip
                    bar.refresh()
                if not trained:
                    time.sleep(0.002)
        except KeyboardInterrupt:
            interrupted = True  # still write summary and checkpoint below, then re-raise
        finally:
            bar.close()
            # Late chunks see `stop` and return at once; the run's keys expire within the hour.
            pipe = self.client.pipeline(transaction=False)
            pipe.set(self.keys.stop, 1, ex=3600)
            for key in (self.keys.stream, self.keys.actor_counter, self.keys.weights_latest):
                pipe.expire(key, 3600)
            pipe.execute()
            self._stop_ingest.set()
            ingest.join(timeout=5)
            self._drain_arrivals()
        wall = time.perf_counter() - t0
        self._finish(wall, solved, interrupted)
        if interrupted:
            raise KeyboardInterrupt
        return RunResult(
            self.run_dir, solved, self.env_steps, self.learner.updates, wall, best, evals
        )

    def lag_stats(self, since: int = 0) -> dict[str, float | None]:
        """Policy lag at ingest (versions and gradient steps) and divergence at sync checks,
        over the chunks that arrived after the first `since`."""
        lags = np.asarray(self.lags[since:] or [0])
        lag_updates = np.asarray(self.lag_updates[since:] or [0])
        divergences = [d for d, i in self.divergences if i >= since]
        return {
            "lag_versions_mean": float(lags.mean()),
            "lag_versions_max": int(lags.max()),
            "lag_updates_mean": float(lag_updates.mean()),
            "lag_updates_p95": float(np.percentile(lag_updates, 95)),
            "lag_updates_max": int(lag_updates.max()),
            "divergence_mean": float(np.mean(divergences)) if divergences else None,
        }

    def _log_eval(self, returns: np.ndarray, wall: float) -> None:
        row = {
            "env_steps": self.env_steps,
            "wall_s": round(wall, 3),
            "eval/return_mean": float(returns.mean()),
            "eval/return_std": float(returns.std()),
            "charts/episodic_return": float(np.mean(self.episode_returns[-20:]))
            if self.episode_returns
            else None,
            "losses/td_loss": self.last_loss,
            "learner/updates": self.learner.updates,
            "learner/policy_version": self.source.version,
            "learner/replay_size": self.replay.size,
            "pipeline/chunks": self.reader.stats.chunks,
            "pipeline/duplicates": self.reader.stats.duplicates,
            "pipeline/rejected": self.reader.stats.rejected,
            "pipeline/lost_chunks": self.dispatcher.lost,
            "pipeline/workers": self.dispatcher.slots(),
            **{f"pipeline/{k}": v for k, v in self.lag_stats().items()},
            **{f"pipeline/{k}": v for k, v in self.sync_totals().items()},
        }
        self.metrics.write(row)

    def _finish(self, wall: float, solved: bool, interrupted: bool) -> None:
        meta = {"run_id": self.run_id, "env": self.cfg.env, "env_steps": str(self.env_steps),
                "updates": str(self.learner.updates), "policy_version": str(self.source.version)}  # fmt: skip
        save_checkpoint(self.run_dir, "final", self.learner.state_tensors(), meta)
        summary = {
            "run_id": self.run_id,
            "solved": solved,
            "interrupted": interrupted,
            "target_return": self.target,
            "env_steps": self.env_steps,
            "updates": self.learner.updates,
            "wall_s": round(wall, 3),
            "policy_versions": self.source.version + 1,
            "ingest": vars(self.reader.stats),
            "ingest_cpu_fraction": round(self.ingest_cpu_s / max(wall, 1e-9), 4),
            "lost_chunks": self.dispatcher.lost,
            "sync_rule": self.cfg.sync,
            "sync_total": self.sync_totals(),
            "lag": self.lag_stats(),
            "sync_per_worker": self.worker_sync,
        }
        (self.run_dir / "summary.json").write_text(json.dumps(summary, indent=2))
        self.metrics.close()
        self.evaluator.close()
