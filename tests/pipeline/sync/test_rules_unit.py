"""Sync rules as pure decisions on a FakeSyncState (no server), and their spec strings."""

from __future__ import annotations

import pytest

from clusterenv.pipeline.behaviour import EpsilonGreedy
from clusterenv.pipeline.sync.rules import DEFAULT_SYNC, Always, Aps, Interval, OnChange, parse_sync
from tests.fakes import FakeSyncState


def test_always_fetches_even_the_version_it_holds():
    rule = Always()
    assert rule.should_fetch(FakeSyncState(version=3), latest=3, behaviour=EpsilonGreedy(0.1))
    assert rule.should_fetch(FakeSyncState(version=3), latest=4, behaviour=EpsilonGreedy(0.1))


def test_on_change_fetches_only_a_different_version():
    rule = OnChange()
    assert not rule.should_fetch(FakeSyncState(version=3), latest=3, behaviour=EpsilonGreedy(0.0))
    assert rule.should_fetch(FakeSyncState(version=3), latest=4, behaviour=EpsilonGreedy(0.0))


@pytest.mark.parametrize(
    "steps_since_fetch, latest, fetch",
    [(999, 4, False), (1000, 4, True), (5000, 4, True), (5000, 3, False)],
)
def test_interval_needs_n_steps_and_a_newer_version(steps_since_fetch, latest, fetch):
    state = FakeSyncState(version=3, steps_since_fetch=steps_since_fetch)
    assert Interval(steps=1000).should_fetch(state, latest, EpsilonGreedy(0.0)) is fetch


def test_aps_never_fetches_the_version_it_holds_nor_measures():
    state = FakeSyncState(version=5, own_version_stored=False, seconds=1e9, divergence=None)
    rule = Aps(tolerance=0.0, max_lag_versions=1, max_lag_seconds=1.0)
    assert not rule.should_fetch(state, latest=5, behaviour=EpsilonGreedy(0.1))
    assert state.asked == []


@pytest.mark.parametrize("d, fetch", [(0.0, False), (0.0099, False), (0.01, False), (0.0101, True)])
def test_aps_fetches_past_the_tolerance(d, fetch):
    state = FakeSyncState(version=2, divergence=d)
    assert Aps(tolerance=0.01).should_fetch(state, latest=3, behaviour=EpsilonGreedy(0.04)) is fetch


def test_aps_measures_the_latest_version_with_its_measure_and_behaviour():
    state = FakeSyncState(version=2, divergence=0.0)
    Aps(tolerance=0.5, divergence="tv").should_fetch(state, latest=7, behaviour=EpsilonGreedy(0.25))
    assert state.asked == [(7, EpsilonGreedy(0.25), "tv")]


def test_aps_fetches_when_no_divergence_can_be_measured():
    # No probe for the newer version (or no reference states): fetch rather than drift blind.
    state = FakeSyncState(version=2, divergence=None)
    assert Aps(tolerance=1e9).should_fetch(state, latest=3, behaviour=EpsilonGreedy(0.0))


def test_aps_eviction_guard_fetches_without_measuring():
    state = FakeSyncState(version=2, own_version_stored=False, divergence=0.0)
    assert Aps(tolerance=1.0).should_fetch(state, latest=3, behaviour=EpsilonGreedy(0.0))
    assert state.asked == []  # retention dropped the held version: no probe read needed


@pytest.mark.parametrize("latest, fetch", [(4, False), (5, True), (9, True)])
def test_aps_max_lag_versions(latest, fetch):
    state = FakeSyncState(version=2, divergence=0.0)
    assert (
        Aps(tolerance=1.0, max_lag_versions=3).should_fetch(state, latest, EpsilonGreedy(0.0))
        is fetch
    )
    assert (state.asked == []) is fetch  # the guard decides before any divergence is read


@pytest.mark.parametrize("seconds, fetch", [(9.99, False), (10.0, True), (60.0, True)])
def test_aps_max_lag_seconds(seconds, fetch):
    state = FakeSyncState(version=2, seconds=seconds, divergence=0.0)
    assert (
        Aps(tolerance=1.0, max_lag_seconds=10.0).should_fetch(state, 3, EpsilonGreedy(0.0)) is fetch
    )


def test_aps_lag_guards_are_off_at_zero():
    state = FakeSyncState(version=0, seconds=1e9, divergence=0.0)
    assert not Aps(tolerance=1.0).should_fetch(state, latest=10_000, behaviour=EpsilonGreedy(0.0))
    assert state.asked == [(10_000, EpsilonGreedy(0.0), "value")]


@pytest.mark.parametrize(
    "spec, rule",
    [
        ("always", Always()),
        ("on-change", OnChange()),
        ("interval:4096", Interval(steps=4096)),
        ("aps:0.01", Aps(0.01, "value")),
        ("aps:0", Aps(0.0, "value")),
        ("aps:0.2:tv", Aps(0.2, "tv")),
        ("aps:1e-3:kl", Aps(0.001, "kl")),
    ],
)
def test_parse_sync_builds_the_rule(spec, rule):
    assert parse_sync(spec) == rule


def test_parse_sync_passes_the_lag_guards_to_aps():
    rule = parse_sync("aps:0.1:tv", max_lag_versions=3, max_lag_seconds=2.5)
    assert rule == Aps(0.1, "tv", max_lag_versions=3, max_lag_seconds=2.5)


def test_default_sync_parses():
    assert isinstance(parse_sync(DEFAULT_SYNC), Aps)


@pytest.mark.parametrize("spec", ["always", "on-change", "interval:1024"])
def test_lag_guards_outside_aps_are_refused_not_ignored(spec):
    with pytest.raises(ValueError, match="apply to aps rules only"):
        parse_sync(spec, max_lag_versions=4)
    with pytest.raises(ValueError, match="apply to aps rules only"):
        parse_sync(spec, max_lag_seconds=1.0)


@pytest.mark.parametrize("spec", ["aps:nan", "aps:", "interval:", "interval:-5", "interval:1.5"])
def test_more_bad_specs_are_refused(spec):
    with pytest.raises(ValueError, match=repr(spec)):
        parse_sync(spec)
