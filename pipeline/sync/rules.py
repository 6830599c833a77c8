"""Sync rules: when a worker's weight client fetches the full weights of a newer policy version.

A rule sees the client (its version, steps and seconds since its last fetch, whether its own
version is still stored, and the divergence to a newer version measured on the learner's probe)
and answers whether to fetch now. No rule fetches the version it already holds, but `always`.
"""

from __future__ import annotations

from dataclasses import dataclass

from clusterenv.pipeline.behaviour import MEASURES, Behaviour, EpsilonGreedy
from clusterenv.pipeline.roles import SyncRule, SyncState


@dataclass(frozen=True)
class Always:
    """Fetch on every chunk, even the version already held: the naive baseline."""

    def should_fetch(self, client: SyncState, latest: int, behaviour: Behaviour) -> bool:
        return True


@dataclass(frozen=True)
class OnChange:
    """Fetch whenever a newer version exists (RLlib's pull-if-newer)."""

    def should_fetch(self, client: SyncState, latest: int, behaviour: Behaviour) -> bool:
        return latest != client.version


@dataclass(frozen=True)
class Interval:
    """Fetch once `steps` env steps have passed since the last fetch (Ape-X style)."""

    steps: int

    def should_fetch(self, client: SyncState, latest: int, behaviour: Behaviour) -> bool:
        return latest != client.version and client.steps_since_fetch >= self.steps


@dataclass(frozen=True)
class Aps:
    """Adaptive policy sync: fetch when the policy has drifted past `tolerance`.

    Guards fetch regardless of divergence: the worker's own version is no longer stored (so
    retention bounds staleness), or it lags by `max_lag_versions` versions / `max_lag_seconds`
    seconds.
    """

    tolerance: float
    divergence: str = "value"
    max_lag_versions: int = 0
    max_lag_seconds: float = 0.0

    def should_fetch(self, client: SyncState, latest: int, behaviour: Behaviour) -> bool:
        if latest == client.version:
            return False
        assert client.version is not None
        if not client.own_version_stored:
            return True
        if self.max_lag_versions and latest - client.version >= self.max_lag_versions:
            return True
        if self.max_lag_seconds and client.seconds_since_fetch() >= self.max_lag_seconds:
            return True
        d = client.divergence_to(latest, behaviour, self.divergence)
        return d is None or d > self.tolerance


SYNC_HELP = "always | on-change | interval:N (env steps) | aps:TOL[:value|tv|kl]"
# From bench/sync_policies (docs/benchmarks.md): of the rules no worse than on-change in median
# steps to solve on both CartPole-v1 and Acrobot-v1, the one moving the fewest bytes (12-20x fewer
# weight bytes than on-change). It is not on the Acrobot Pareto front, and interval:1024 solved
# CartPole in fewer steps at 2.8x the bytes.
DEFAULT_SYNC = "aps:0.01"


def parse_sync(
    spec: str,
    max_lag_versions: int = 0,
    max_lag_seconds: float = 0.0,
    kind: type[Behaviour] = EpsilonGreedy,
    q_values: bool = True,
) -> SyncRule:
    """A rule from its spec string, for workers acting with behaviours of `kind`
    (pipeline/behaviour.py: an `aps:TOL` without a measure takes that kind's default) for a
    learner that has Q-values or not (`q_values`: the value measure needs them); a ValueError
    naming the problem.

    The lag guards belong to APS; given with another rule they are refused, not ignored.
    """
    if not spec.startswith("aps:") and (max_lag_versions or max_lag_seconds):
        raise ValueError(
            f"sync {spec!r}: --max-lag-versions and --max-lag-seconds apply to aps rules only"
        )
    if spec == "always":
        return Always()
    if spec == "on-change":
        return OnChange()
    name, _, rest = spec.partition(":")
    if name == "interval":
        steps = int(rest) if rest.isdigit() else 0
        if steps < 1:
            raise ValueError(
                f"sync {spec!r}: interval needs a positive env-step count, e.g. interval:4096"
            )
        return Interval(steps=steps)
    if name == "aps":
        tol_text, _, measure_text = rest.partition(":")
        measure = measure_text or None
        try:
            tolerance = float(tol_text)
        except ValueError:
            tolerance = -1.0
        if not tolerance >= 0.0:
            raise ValueError(f"sync {spec!r}: aps needs a tolerance >= 0, e.g. aps:0.01")
        if measure is not None and measure not in MEASURES:
            raise ValueError(
                f"sync {spec!r}: unknown divergence {measure!r}; choose {', '.join(sorted(MEASURES))}"
            )
        try:
            measure = kind.measure(measure, q_values)
        except ValueError as exc:
            raise ValueError(f"sync {spec!r}: {exc}") from None
        return Aps(tolerance, measure, max_lag_versions, max_lag_seconds)
    raise ValueError(f"unknown sync policy {spec!r}; choose {SYNC_HELP}")
