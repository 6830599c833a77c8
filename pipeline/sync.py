"""Sync rules: when a worker's weight client fetches a newer policy version.

A rule sees the client's state (its version, env steps since its last fetch) and the latest
published version, and answers whether to fetch the full weights now.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


class SyncState(Protocol):
    """What a rule may look at on the weight client."""

    version: int | None
    steps_since_fetch: int


class SyncRule(Protocol):
    spec: str

    def should_fetch(self, client: SyncState, latest: int) -> bool: ...


@dataclass(frozen=True)
class Always:
    """Fetch on every chunk, even the version already held: the naive baseline."""

    spec: str = "always"

    def should_fetch(self, client: SyncState, latest: int) -> bool:
        return True


@dataclass(frozen=True)
class OnChange:
    """Fetch whenever a newer version exists (RLlib's pull-if-newer)."""

    spec: str = "on-change"

    def should_fetch(self, client: SyncState, latest: int) -> bool:
        return latest != client.version


@dataclass(frozen=True)
class Interval:
    """Fetch once `steps` env steps have passed since the last fetch (Ape-X style)."""

    steps: int
    spec: str = ""

    def should_fetch(self, client: SyncState, latest: int) -> bool:
        return latest != client.version and client.steps_since_fetch >= self.steps


def parse_sync(spec: str) -> SyncRule:
    """`always`, `on-change` or `interval:N`; a clear ValueError for anything else."""
    if spec == "always":
        return Always()
    if spec == "on-change":
        return OnChange()
    name, _, arg = spec.partition(":")
    if name == "interval":
        try:
            steps = int(arg)
        except ValueError:
            steps = 0
        if steps < 1:
            raise ValueError(f"sync {spec!r}: interval needs a positive env-step count, e.g. interval:4096")
        return Interval(steps=steps, spec=spec)
    raise ValueError(f"unknown sync policy {spec!r}; choose always, on-change or interval:N")
