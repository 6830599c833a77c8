"""The learner's Prometheus figures (--metrics-port): what a scrape returns, parsed with
prometheus_client's own parser, from a snapshot and from a run of the real loop."""

from __future__ import annotations

import math

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from clusterenv.learner.run.loop import Run
from clusterenv.learner.run.prometheus import Figures, RunGauges
from tests.inprocess import FakeCluster
from tests.learner.test_loop import CHUNK, run_dir, small


def samples(text: str) -> dict[str, float]:
    """Every sample of Prometheus exposition text by name (labels folded into the name), as
    prometheus_client's own parser reads it."""
    found = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            labels = ",".join(f"{k}={v}" for k, v in sorted(s.labels.items()))
            found[f"{s.name}{{{labels}}}" if labels else s.name] = s.value
    return found


def scrape(registry: CollectorRegistry) -> dict[str, float]:
    return samples(generate_latest(registry).decode())


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_scrape_reads_the_latest_figures_and_rates_over_the_window():
    clock, registry = Clock(), CollectorRegistry()
    gauges = RunGauges({"run_id": "r1", "env": "CartPole-v1", "algo": "dqn"}, clock=clock)
    registry.register(gauges)
    before = scrape(registry)
    assert before["clusterenv_env_steps_total"] == 0 and math.isnan(
        before["clusterenv_eval_return_last"]
    )
    assert gauges.due()
    gauges.refresh(Figures(env_steps=1000, updates=10))
    assert not gauges.due()
    clock.now += 4.0
    assert gauges.due()
    gauges.refresh(Figures(
        env_steps=5000, updates=50, chunks_in_flight=6, chunks_queued=2, live_workers=4,
        policy_version=7, lag_versions=1.5, weight_fetches=9, weight_bytes=9000, probe_bytes=300,
        last_eval=120.0, best_eval=130.0, chunks_accepted=20, chunks_rejected=1, chunks_lost=2,
        env_errors={"step": 3, "reset": 0},
    ))  # fmt: skip
    got = scrape(registry)
    assert got["clusterenv_run_info{algo=dqn,env=CartPole-v1,run_id=r1}"] == 1.0
    assert got["clusterenv_env_steps_total"] == 5000 and got["clusterenv_updates_total"] == 50
    assert got["clusterenv_env_steps_per_second"] == 1000.0  # 4,000 steps in 4 s
    assert got["clusterenv_updates_per_second"] == 10.0
    assert got["clusterenv_chunks_per_worker"] == 1.5  # 6 in flight over 4 live processes
    assert got["clusterenv_chunks_queued"] == 2 and got["clusterenv_live_workers"] == 4
    assert got["clusterenv_env_errors_total{kind=step}"] == 3
    assert got["clusterenv_env_errors_total{kind=reset}"] == 0
    assert got["clusterenv_weight_fetched_bytes_total"] == 9000
    assert (
        got["clusterenv_eval_return_last"] == 120.0 and got["clusterenv_policy_lag_versions"] == 1.5
    )
    assert got["clusterenv_chunks_lost_total"] == 2 and got["clusterenv_chunks_rejected_total"] == 1
    # The rates look back RATE_WINDOW_S (10 s), not to the run's start: 60 s later, 600 steps in
    # the last 10 s.
    for _ in range(12):
        clock.now += 5.0
        gauges.refresh(Figures(env_steps=5000 + int((clock.now - 104.0) * 60), updates=50))
    assert scrape(registry)["clusterenv_env_steps_per_second"] == 60.0


def test_a_run_of_the_real_loop_reports_its_figures(tmp_path):
    cluster, registry = FakeCluster(processes=2, eval_return=12.0), CollectorRegistry()
    run = Run.create(small(), cluster.factory, run_dir(tmp_path), "run-m", metrics=registry)
    run.gauges.every_s = 0.0  # a refresh every turn: the last one is within a turn of the end
    result = run.run()
    got = scrape(registry)
    assert got["clusterenv_run_info{algo=dqn,env=CartPole-v1,run_id=run-m}"] == 1.0
    assert 0 < got["clusterenv_env_steps_total"] <= result.env_steps == 16 * CHUNK
    assert got["clusterenv_chunks_accepted_total"] * CHUNK == got["clusterenv_env_steps_total"]
    assert 0 < got["clusterenv_updates_total"] <= result.updates
    assert got["clusterenv_live_workers"] == 2
    # The dispatcher's quota: --tasks-per-process (2) tasks per live process at most.
    assert got["clusterenv_chunks_per_worker"] <= run.cfg.dispatch.tasks_per_process
    assert got["clusterenv_eval_return_best"] == 12.0
    assert got["clusterenv_policy_version"] >= 1
    assert {k for k in got if k.startswith("clusterenv_env_errors_total")} == {
        f"clusterenv_env_errors_total{{kind={kind}}}" for kind in ("hang", "make", "reset", "step")
    }
    # The learner process's own CPU and memory are not in a run's registry: serve_metrics adds them.
    assert "process_resident_memory_bytes" not in got
