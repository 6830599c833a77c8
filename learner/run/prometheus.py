"""Prometheus metrics of a running learner, for operators and autoscalers: `clusterenv train
--metrics-port PORT` serves them at http://HOST:PORT/metrics (off by default; docs/operations.md,
"Metrics for operators").

The loop hands `RunGauges` a `Figures` snapshot at most once a second; a scrape runs in the HTTP
server's thread and reads only the latest snapshot, never the run's live state (the loop's dicts
change under it). The autoscaling signal is `clusterenv_chunks_per_worker`, chunks in flight
(running or queued) per live worker process: the dispatcher keeps `--tasks-per-process` tasks per
process while the learner wants data, fewer once the rate limiter holds collection back, so a
value at the quota says more workers would be used and one below it says fewer would do — the
(active + queued) / workers that KEDA's Celery recipes scale on (docker/autoscaling/).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, ProcessCollector, start_http_server
from prometheus_client.metrics_core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    InfoMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

PREFIX = "clusterenv"
RATE_WINDOW_S = 10.0  # the steps/s and updates/s gauges: over the last this many seconds


@dataclass(frozen=True)
class Figures:
    """A run's figures at one moment, as the loop counts them."""

    env_steps: int = 0
    updates: int = 0
    chunks_in_flight: int = 0
    chunks_queued: int = 0  # in flight and not yet taken by a worker
    live_workers: int = 0  # worker processes with a live heartbeat
    policy_version: int = 0
    lag_versions: float = 0.0  # mean over the latest chunks accepted
    weight_fetches: int = 0
    weight_bytes: int = 0
    probe_bytes: int = 0
    last_eval: float = float("nan")
    best_eval: float = float("nan")
    chunks_accepted: int = 0
    chunks_rejected: int = 0
    chunks_lost: int = 0  # written off: not back within --lost-after-s, or their worker died
    env_errors: Mapping[str, int] = field(default_factory=dict)  # chunks ended by an env fault


class RunGauges(Collector):
    """The run's metric families, built from the newest `Figures` at each scrape."""

    def __init__(self, run: Mapping[str, str], every_s: float = 1.0,
                 clock: Callable[[], float] = time.monotonic):  # fmt: skip
        self.run, self.every_s, self.clock = dict(run), every_s, clock
        self._figures = Figures()
        self._history: deque[tuple[float, int, int]] = deque()  # (time, env steps, updates)
        self._rates = (0.0, 0.0)
        self._at = -float("inf")

    def due(self) -> bool:
        return self.clock() - self._at >= self.every_s

    def refresh(self, figures: Figures) -> None:
        now = self._at = self.clock()
        history = self._history
        history.append((now, figures.env_steps, figures.updates))
        while len(history) > 2 and now - history[1][0] >= RATE_WINDOW_S:
            history.popleft()
        t0, steps0, updates0 = history[0]
        span = now - t0
        # One assignment each: a scrape in the server's thread sees the old or the new, whole.
        if span > 0:
            self._rates = ((figures.env_steps - steps0) / span, (figures.updates - updates0) / span)
        self._figures = figures

    def collect(self) -> Iterator[Metric]:
        f, (steps_per_s, updates_per_s) = self._figures, self._rates

        def gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
            return GaugeMetricFamily(f"{PREFIX}_{name}", doc, value=value)

        def counter(name: str, doc: str, value: float) -> CounterMetricFamily:
            return CounterMetricFamily(f"{PREFIX}_{name}", doc, value=value)

        yield InfoMetricFamily(f"{PREFIX}_run", "the run this learner trains", value=self.run)
        yield counter("env_steps", "env steps in the chunks accepted", f.env_steps)
        yield counter("updates", "learner updates (gradient steps)", f.updates)
        yield gauge("env_steps_per_second", f"env steps/s over the last {RATE_WINDOW_S:g} s",
                    steps_per_s)  # fmt: skip
        yield gauge("updates_per_second", f"updates/s over the last {RATE_WINDOW_S:g} s",
                    updates_per_s)  # fmt: skip
        yield gauge("chunks_in_flight", "chunks sent and not back yet (running or queued)",
                    f.chunks_in_flight)  # fmt: skip
        yield gauge("chunks_queued", "chunks in flight that no worker has taken yet",
                    f.chunks_queued)  # fmt: skip
        yield gauge("live_workers", "worker processes with a live heartbeat", f.live_workers)
        yield gauge("chunks_per_worker", "chunks in flight per live worker process (the "
                    "autoscaling signal: at --tasks-per-process the workers are the bottleneck)",
                    f.chunks_in_flight / max(1, f.live_workers))  # fmt: skip
        yield gauge("policy_version", "newest weight version published", f.policy_version)
        yield gauge("policy_lag_versions", "mean versions the latest accepted chunks' behaviour "
                    "policy was behind the learner", f.lag_versions)  # fmt: skip
        yield counter("weight_fetches", "weight versions the workers fetched", f.weight_fetches)
        yield counter("weight_fetched_bytes", "weight bytes the workers fetched", f.weight_bytes)
        yield counter("probe_fetched_bytes", "APS probe bytes the workers fetched", f.probe_bytes)
        yield gauge("eval_return_last", "mean return of the latest greedy evaluation (NaN before "
                    "the first)", f.last_eval)  # fmt: skip
        yield gauge("eval_return_best", "best greedy evaluation so far", f.best_eval)
        yield counter("chunks_accepted", "chunks accepted into the learner", f.chunks_accepted)
        yield counter("chunks_rejected", "chunks refused at ingest (bad input)", f.chunks_rejected)
        yield counter("chunks_lost", "chunks written off (late, or their worker died)",
                      f.chunks_lost)  # fmt: skip
        errors = CounterMetricFamily(f"{PREFIX}_env_errors", "chunks ended by an env fault",
                                     labels=["kind"])  # fmt: skip
        for kind, count in sorted(f.env_errors.items()):
            errors.add_metric([kind], count)
        yield errors


@dataclass
class MetricsServer:
    """The HTTP server of /metrics, in a daemon thread; `registry` holds what it serves."""

    registry: CollectorRegistry
    httpd: WSGIServer

    @property
    def port(self) -> int:
        return self.httpd.server_port

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def serve_metrics(host: str, port: int) -> MetricsServer:
    """Serve a new registry (the learner process's CPU and memory in it) at host:port; port 0 picks
    a free one. Raises OSError when the address cannot be bound."""
    registry = CollectorRegistry()
    ProcessCollector(registry=registry)
    httpd, _ = start_http_server(port, addr=host, registry=registry)
    return MetricsServer(registry, httpd)
