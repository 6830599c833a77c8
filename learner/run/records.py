"""What a run writes down: a metrics row per finished evaluation (metrics.jsonl and TensorBoard)
and summary.json when it ends. It reads the components it reports on; it changes none."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from clusterenv.learner.core.agent import Learner
from clusterenv.learner.persistence.best import BestKeeper
from clusterenv.learner.run.accounting import RunAccounting, id_ranges
from clusterenv.learner.run.evaluation import EvalResult, RemoteEvaluation
from clusterenv.learner.run.ingest import Ingest
from clusterenv.learner.run.metrics import MetricsWriter
from clusterenv.learner.run.publisher import Publisher
from clusterenv.pipeline.chunks.dispatcher import Dispatcher


class RunRecords:
    def __init__(
        self,
        run_dir: Path,
        learner: Learner,
        publisher: Publisher,
        accounting: RunAccounting,
        ingest: Ingest,
        dispatcher: Dispatcher,
        evaluation: RemoteEvaluation,
        best: BestKeeper,
    ):
        self.run_dir, self.learner, self.publisher = run_dir, learner, publisher
        self.accounting, self.ingest, self.dispatcher = accounting, ingest, dispatcher
        self.evaluation, self.best = evaluation, best
        self.metrics: MetricsWriter | None = None
        self._chunks_at_request = 0

    def open(self) -> None:
        """metrics.jsonl appears: from here on a signal still ends with a summary."""
        self.metrics = MetricsWriter(self.run_dir / "metrics.jsonl")

    def eval_requested(self) -> None:
        self._chunks_at_request = self.ingest.reader.stats.chunks

    def eval_row(self, result: EvalResult, wall: float) -> None:
        """One metrics row per finished evaluation: `env_steps` and `eval/policy_version` are what
        it was asked about; `wall_s` is when its result reached the learner."""
        acc, returns, stats = self.accounting, result.returns, self.ingest.reader.stats
        row = {
            "env_steps": result.env_steps,
            "wall_s": round(wall, 3),
            "eval/return_mean": float(returns.mean()),
            "eval/return_std": float(returns.std()),
            "eval/policy_version": result.version,
            "eval/latency_s": round(self.evaluation.clock() - result.requested_at, 3),
            # Collection goes on while the workers evaluate: chunks accepted meanwhile.
            "eval/chunks_meanwhile": stats.chunks - self._chunks_at_request,
            "charts/episodic_return": acc.recent_return(),
            **self.learner.metrics(),
            "learner/updates": self.learner.updates,
            "learner/policy_version": self.publisher.version,
            "pipeline/chunks": stats.chunks,
            "pipeline/duplicates": stats.duplicates,
            "pipeline/rejected": stats.rejected,
            "pipeline/lost_chunks": self.dispatcher.lost,
            "pipeline/workers": self.dispatcher.slots(),
            **{f"pipeline/env_errors/{k}": v for k, v in acc.env_errors.items()},
            **{f"pipeline/{k}": v for k, v in acc.window_lag_stats().items()},
            **{f"pipeline/{k}": v for k, v in acc.sync_totals().items()},
        }
        assert self.metrics is not None
        self.metrics.write(row)

    def summary(self, run: dict[str, Any], wall: float) -> dict[str, Any]:
        """summary.json: `run`'s own fields (id, outcome, config choices), then the components'."""
        acc, reader = self.accounting, self.ingest.reader
        summary = {
            **run,
            "env_steps": acc.env_steps,
            "updates": self.learner.updates,
            "wall_s": round(wall, 3),
            "policy_versions": self.publisher.version + 1,
            "ingest": vars(reader.stats),
            "ingest_retries": self.ingest.retried,
            "ingest_cpu_fraction": round(self.ingest.cpu_s / max(wall, 1e-9), 4),
            "lost_chunks": self.dispatcher.lost,
            "late_chunks": self.dispatcher.late,
            # Which chunk ids reached the learner, each once: the evidence a fault test checks.
            "accepted_chunk_ids": id_ranges(reader.seen),
            "broker_recoveries": acc.broker_recoveries,
            "best": self.best.chosen,  # what best.safetensors holds: eval mean, env steps, version
            "learner": self.learner.metrics(),
            **acc.summary(),
        }
        (self.run_dir / "summary.json").write_text(json.dumps(summary, indent=2))
        return summary

    def close(self) -> None:
        if self.metrics is not None:
            self.metrics.close()
