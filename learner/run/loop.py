"""The learner process, top to bottom: dispatch chunks, train, publish, evaluate, checkpoint.

The ingest thread (learner/run/ingest.py) reads the chunks the workers wrote into the agent's
learner (DQN's replay, PPO's chunk queue). The main thread turns: take note of arrived chunks and
keep the workers busy (dispatch), run up to `updates_per_turn` learner updates the data allows
(publishing a version every `publish_every`), and every `eval_every` env steps ask the workers for
a greedy evaluation of the current weights (learner/run/evaluation.py), recording each result
when it comes back, until a result reaches the target return or the budget is spent. Every
`checkpoint_every_s` seconds (or `checkpoint_every_updates`) it writes a checkpoint of every
component (learner/persistence/components.py) that `--resume` continues from.

Everything on the broker goes through the roles of `Broker` (learner/run/wiring.py), so the same
loop runs against Redis and Celery or against the in-process roles of tests/inprocess.py.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from prometheus_client import CollectorRegistry

from clusterenv.learner.config import TrainConfig
from clusterenv.learner.core.agent import Saveable
from clusterenv.learner.core.networks import network_arrays
from clusterenv.learner.persistence.checkpoint import save_checkpoint
from clusterenv.learner.persistence.components import LEARNER, gather, named_tensors, scatter
from clusterenv.learner.persistence.resume import Resumed, record_run_id
from clusterenv.learner.run.lost_workers import LostWorkers
from clusterenv.learner.run.progress import Progress
from clusterenv.learner.run.prometheus import Figures
from clusterenv.learner.run.recovery import BrokerRecovery
from clusterenv.learner.run.wiring import BrokerFactory, RunParts, wire
from clusterenv.pipeline.connect import BROKER_ERRORS, broker_gone

log = logging.getLogger(__name__)


class RunFailed(RuntimeError):
    """The run cannot go on (ingest died, the broker is gone); the message says why."""

    def __init__(self, message: str, broker_gone: bool = False):
        super().__init__(message)
        self.broker_gone = broker_gone


@dataclass
class RunResult:
    run_dir: Path
    solved: bool
    env_steps: int
    updates: int
    wall_s: float
    best_eval: float
    evals: list[tuple[int, float]] = field(default_factory=list)


class Run(RunParts):
    """The loop over a run's parts. `Run.create` wires them (learner/run/wiring.py)."""

    def __init__(self, parts: RunParts, resume: Resumed | None = None):
        super().__init__(**vars(parts))
        self.learner = self.agent.learner
        self.recovery = BrokerRecovery(
            self.broker.flags, self.dispatcher, self.evaluation,
            lambda: self.publish(new_reference=True), self.accounting,
        )  # fmt: skip
        self.lost_workers = LostWorkers(self.broker.takers, self.broker.workers, self.dispatcher)
        self.wall_before, self.resumed = 0.0, resume  # wall seconds of the learners before
        if resume is not None:
            scatter(self.components(), resume.tensors, resume.state)
            self.publisher.continue_above(resume.newest_version)
            for dead in resume.run_ids:
                self.broker.stop_run(dead)
        self.t0 = time.perf_counter() - self.wall_before  # again when the run starts

    @classmethod
    def create(cls, cfg: TrainConfig, broker_for: BrokerFactory, run_dir: Path, run_id: str,
               resume: Resumed | None = None, metrics: CollectorRegistry | None = None) -> Run:  # fmt: skip
        """A run of `cfg` on the broker `broker_for` makes, resumed from `resume` if given, its
        Prometheus figures in `metrics` if given."""
        return cls(wire(cfg, broker_for, run_dir, run_id, metrics), resume)

    def components(self) -> Mapping[str, Saveable]:
        """What a checkpoint holds, by name: each saves and restores itself."""
        return {"run": self, LEARNER: self.learner, "publisher": self.publisher,
                "dispatch": self.dispatcher, "evaluation": self.evaluation,
                "schedule": self.schedule, "accounting": self.accounting,
                "ingest": self.ingest}  # fmt: skip

    def save(self) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        return {}, {"run_id": self.run_id, "wall_s": time.perf_counter() - self.t0}

    def restore(self, arrays: Mapping[str, np.ndarray], values: Mapping[str, Any]) -> None:
        self.wall_before = values["wall_s"]

    # --- the parts of one turn of the main loop ------------------------------------------------
    def collect(self) -> None:
        """Note the chunks that arrived, then keep every live worker process busy."""
        for arrival in self.ingest.arrivals():
            self.dispatcher.arrived(arrival.header["chunk"])
            self.lost_workers.arrived(arrival.header["chunk"])
            self.accounting.record(arrival)
        self.lost_workers.check()  # a dead worker's chunks leave the quota at once
        pending = self.dispatcher.pending_env_steps
        actor_envs = self.dispatcher.slots() * self.cfg.collection.envs_per_worker
        self.dispatcher.top_up(
            self.agent.behaviour(self.accounting.env_steps + pending, actor_envs), self._may_send
        )

    def _may_send(self, pending: int) -> bool:
        if self.accounting.env_steps + pending >= self.cfg.total_steps:
            return False
        return self.agent.limiter.can_insert(self.dispatcher.task_env_steps, pending)

    def train(self) -> int:
        """Up to `updates_per_turn` learner updates, as far as the data allows."""
        self.learner.collected(self.accounting.env_steps)
        done = 0
        while done < self.cfg.updates_per_turn and self.learner.step():
            done += 1
            if self.learner.updates % self.agent.publish_every == 0:
                self.publish()
        return done

    def publish(self, new_reference: bool = False) -> int:
        """Publish the learner's weights as a new version; its number."""
        return self.publisher.publish(
            self.learner.get_weights(), self.learner.updates, new_reference
        )

    def request_eval(self) -> None:
        """Ask the workers to evaluate the current weights (published first if they are new)."""
        weights = self.learner.get_weights()
        if self.publisher.updates_at_version.get(self.publisher.version) != self.learner.updates:
            self.publisher.publish(weights, self.learner.updates)
        parts = self.cfg.evaluation.parts(self.dispatcher.slots())
        self.evaluation.request(self.publisher.version, self.accounting.env_steps, parts)
        self.best.asked(self.publisher.version, weights)
        self.records.eval_requested()

    def record_evals(self) -> None:
        """Log each finished evaluation and keep the best network."""
        for result, mean in self.schedule.results():
            wall = time.perf_counter() - self.t0
            self.records.eval_row(result, wall)
            self.progress.evaluated(result.env_steps, mean, result.version, wall)
            self.best.evaluated(result, mean)

    def check_health(self) -> None:
        """Stop on a dead ingest thread; recover a broker that lost the run's state
        (learner/run/recovery.py)."""
        error = self.ingest.error
        if error is not None:
            raise RunFailed(f"ingest failed: {type(error).__name__}: {error}", broker_gone(error))
        faults, acc = self.cfg.collection.env_faults_in_a_row, self.accounting
        if acc.faults_in_a_row >= faults:
            raise RunFailed(f"env {self.cfg.env} failed in {acc.faults_in_a_row} chunks in a "
                            f"row; the last: {acc.last_env_error}")  # fmt: skip
        self.recovery.check()

    def turn(self) -> bool:
        """One turn of the main loop; False once the run is over."""
        self.check_health()
        self.collect()
        trained = self.train()
        if self.checkpoints.due(self.learner.updates):
            self.checkpoint()
        steps = self.accounting.env_steps
        out_of_work = (
            steps >= self.cfg.total_steps and not self.dispatcher.in_flight and not trained
        )
        self.schedule.tick(steps, out_of_work, self.request_eval)
        self.record_evals()
        if self.schedule.done(steps, out_of_work):
            return False
        self.progress.tick(
            steps, self.schedule.last_mean, self.publisher.version,
            lambda: self.accounting.sync_totals().get("weight_fetches", 0),
        )  # fmt: skip
        self.refresh_gauges()
        if not trained:
            time.sleep(0.002)
        return True

    def refresh_gauges(self) -> None:
        """Hand the Prometheus server (--metrics-port) the run's figures, at most once a second."""
        if self.gauges is None or not self.gauges.due():
            return
        acc, stats, in_flight = (
            self.accounting,
            self.ingest.reader.stats,
            sorted(self.dispatcher.in_flight),
        )
        sync, lags = acc.sync_totals(), acc.lag_versions[-64:]
        self.gauges.refresh(Figures(
            env_steps=acc.env_steps, updates=self.learner.updates,
            chunks_in_flight=len(in_flight),
            chunks_queued=len(in_flight) - len(self.broker.takers.takers(in_flight)),
            live_workers=self.dispatcher.slots(), policy_version=self.publisher.version,
            lag_versions=sum(lags) / len(lags) if lags else 0.0,
            weight_fetches=sync.get("weight_fetches", 0), weight_bytes=sync.get("weight_bytes", 0),
            probe_bytes=sync.get("probe_bytes", 0), last_eval=self.schedule.last_mean,
            best_eval=self.schedule.best_mean, chunks_accepted=stats.chunks,
            chunks_rejected=stats.rejected, chunks_lost=self.dispatcher.lost,
            env_errors=dict(acc.env_errors),
        ))  # fmt: skip

    def checkpoint(self) -> Path:
        """Write a periodic checkpoint of every component now."""
        return self.checkpoints.save(*gather(self.components()), self.learner.updates)

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
        self.records.open()
        try:
            (self.run_dir / "config.json").write_text(cfg.to_json())
            record_run_id(self.run_dir, self.run_id)
            self.broker.flags.mark_started()
            self.publish()  # the first version: workers act with the untrained (or resumed) network
            self.ingest.start()
            while self.turn():
                pass
        except KeyboardInterrupt:
            interrupted = True
        except RunFailed as exc:
            failure = exc
        except BROKER_ERRORS as exc:  # past the clients' own retries
            failure = RunFailed(f"broker unreachable: {type(exc).__name__}: {exc}", True)
        finally:
            self.progress.close()
            self._stop(broker_is_gone=failure is not None and failure.broker_gone)
        wall = time.perf_counter() - self.t0
        self._finish(wall, interrupted, failure)
        if interrupted:
            raise KeyboardInterrupt
        if failure is not None:
            raise failure
        s = self.schedule
        return RunResult(self.run_dir, s.solved, self.accounting.env_steps, self.learner.updates,
                         wall, s.best_mean, s.evals)  # fmt: skip

    def _stop(self, broker_is_gone: bool) -> None:
        """Mark the run stopped (queued chunks return at once), let its keys expire, drain ingest;
        on a broker known to be gone (its clients would retry for half a minute), only the last."""
        if not broker_is_gone:
            try:
                self.broker.flags.mark_stopped()
            except BROKER_ERRORS as exc:  # a broker that is gone keeps nothing to clean up
                log.warning("could not mark the run stopped on the broker: %s", exc)
        self.ingest.stop()
        for arrival in self.ingest.arrivals():
            self.accounting.record(arrival)

    def _finish(self, wall: float, interrupted: bool, failure: RunFailed | None) -> None:
        meta = {"run_id": self.run_id, "env": self.cfg.env,
                "env_steps": str(self.accounting.env_steps), "updates": str(self.learner.updates),
                "policy_version": str(self.publisher.version)}  # fmt: skip
        # The learner's networks alone (not Adam, nor replay): what `clusterenv eval` reads.
        final = named_tensors(LEARNER, network_arrays(self.learner.networks()))
        save_checkpoint(self.run_dir, "final", final, meta)
        self.checkpoint()  # an interrupted or failed run resumes from where it stopped
        summary = self.records.summary({
            "run_id": self.run_id,
            "resumed_from": str(self.resumed.checkpoint) if self.resumed is not None else None,
            "solved": self.schedule.solved,
            "interrupted": interrupted,
            "failed": str(failure) if failure is not None else None,
            "chunks_of_dead_workers": self.lost_workers.written_off,
            "target_return": self.schedule.target,
            "sync_rule": self.cfg.weights.sync,
            "algo": self.cfg.algo,
        }, wall)  # fmt: skip
        if failure is None or not failure.broker_gone:
            self.status.finish(summary)
        self.records.close()
        self.broker.close()
