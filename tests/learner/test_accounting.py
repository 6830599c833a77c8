"""RunAccounting from chunk arrivals: windows of lag stats, summed sync counters (no server)."""

from __future__ import annotations

import pytest

from clusterenv.learner.run.accounting import RunAccounting, id_ranges
from clusterenv.learner.run.ingest import Arrival


def arrival(
    worker: str = "w0",
    lag: int = 0,
    lag_updates: int = 0,
    divergence: float | None = None,
    sync: dict[str, int] | None = None,
    env_steps: int | None = 64,
    episodes: list | None = None,
    transitions: int = 60,
) -> Arrival:
    header = {"worker": worker, "divergence": divergence, "episodes": episodes or []}
    if sync is not None:
        header["sync"] = sync
    if env_steps is not None:
        header["env_steps"] = env_steps
    return Arrival(header, transitions, lag, lag_updates)


def test_window_lag_stats_cover_only_chunks_since_the_previous_call():
    acc = RunAccounting()
    for lag, upd, d in [(1, 10, 0.5), (3, 30, None), (5, 50, 0.1)]:
        acc.record(arrival(lag=lag, lag_updates=upd, divergence=d))
    first = acc.window_lag_stats()
    assert first["lag_versions_mean"] == 3.0 and first["lag_versions_max"] == 5
    assert first["lag_updates_mean"] == 30.0 and first["lag_updates_max"] == 50
    assert first["divergence_mean"] == pytest.approx(0.3)

    acc.record(arrival(lag=0, lag_updates=0, divergence=0.2))
    acc.record(arrival(lag=2, lag_updates=4))
    second = acc.window_lag_stats()
    assert second["lag_versions_mean"] == 1.0 and second["lag_versions_max"] == 2
    assert second["lag_updates_mean"] == 2.0 and second["lag_updates_max"] == 4
    assert second["lag_updates_p95"] == pytest.approx(3.8)
    assert second["divergence_mean"] == pytest.approx(0.2)  # not the first window's 0.5, 0.1

    empty = acc.window_lag_stats()  # nothing arrived since: zeros, and no divergence
    assert empty["lag_versions_mean"] == 0.0 and empty["lag_updates_max"] == 0
    assert empty["divergence_mean"] is None

    # The whole run is still there for the summary.
    assert acc.lag_stats()["lag_versions_max"] == 5
    assert acc.summary()["lag"]["lag_versions_mean"] == pytest.approx(11 / 5)


def test_sync_totals_sum_each_workers_latest_counters():
    acc = RunAccounting()
    acc.record(arrival("w0", sync={"weight_fetches": 1, "weight_bytes": 100}))
    acc.record(arrival("w1", sync={"weight_fetches": 1, "weight_bytes": 100}))
    acc.record(arrival("w0", sync={"weight_fetches": 3, "weight_bytes": 300}))  # cumulative
    acc.record(arrival("w1"))  # a header without counters leaves w1's latest ones
    assert acc.sync_totals() == {"weight_fetches": 4, "weight_bytes": 400}
    assert acc.summary()["sync_total"] == acc.sync_totals()
    assert acc.summary()["sync_per_worker"]["w0"] == {"weight_fetches": 3, "weight_bytes": 300}


def test_no_workers_no_totals():
    assert RunAccounting().sync_totals() == {}


def test_env_steps_from_headers_else_transitions():
    acc = RunAccounting()
    acc.record(arrival(env_steps=256))
    acc.record(arrival(env_steps=None, transitions=60))
    assert acc.env_steps == 316


def test_episode_returns_and_recent_return():
    acc = RunAccounting()
    assert acc.recent_return() is None
    acc.record(arrival(episodes=[[10.0, 10], [20.0, 20]]))
    acc.record(arrival(episodes=[[30.0, 30]]))
    assert acc.episode_returns == [10.0, 20.0, 30.0]
    assert acc.recent_return() == 20.0
    assert acc.recent_return(episodes=2) == 25.0


def test_only_float_divergences_count():
    acc = RunAccounting()
    acc.record(arrival(divergence=None))
    acc.record(arrival(divergence=0.4))
    assert acc.divergences == [(0.4, 1)]  # with the index of its chunk


def test_metrics_rows_are_strict_json(tmp_path):
    import json

    from clusterenv.learner.run.metrics import MetricsWriter, read_metrics

    writer = MetricsWriter(tmp_path / "m.jsonl")
    writer.write({"losses/td_loss": float("nan"), "x": float("inf"), "eval/return_mean": 9.5})
    writer.close()
    line = (tmp_path / "m.jsonl").read_text().strip()

    def refuse(name: str) -> None:
        raise ValueError(f"non-JSON constant {name}")

    assert json.loads(line, parse_constant=refuse) == {
        "losses/td_loss": None, "x": None, "eval/return_mean": 9.5,
    }  # fmt: skip
    assert read_metrics(tmp_path / "m.jsonl")[0]["losses/td_loss"] is None


@pytest.mark.parametrize(
    "ids,ranges",
    [(set(), []), ({4}, [[4, 4]]), ({0, 1, 2, 5, 7, 8}, [[0, 2], [5, 5], [7, 8]])],
)
def test_id_ranges(ids, ranges):
    assert id_ranges(ids) == ranges
