"""Replay and its rate limiter in a learner's checkpoint (--checkpoint-replay): DQN's and SAC's."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

import numpy as np

from clusterenv.learner.replay.rate_limiter import RateLimiter


class Replay(Protocol):
    def save(self) -> tuple[dict[str, np.ndarray], dict[str, Any]]: ...

    def restore(self, rows: Mapping[str, np.ndarray], counters: Mapping[str, Any]) -> None: ...


def save_replay(replay: Replay, limiter: RateLimiter, arrays: dict[str, np.ndarray],
                values: dict[str, Any]) -> None:  # fmt: skip
    """Add replay's rows (`replay.*`) and counters, and the limiter's counts, to a learner's
    state."""
    rows, values["replay"] = replay.save()
    arrays.update({f"replay.{k}": v for k, v in rows.items()})
    # Replay's own count, taken with its rows: the ingest thread may have counted a chunk in the
    # limiter but not yet in replay.
    values["limiter"] = {**limiter.save()[1], "inserts": values["replay"]["inserted"]}


def restore_replay(replay: Replay, limiter: RateLimiter, arrays: Mapping[str, np.ndarray],
                   values: Mapping[str, Any]) -> None:  # fmt: skip
    """Take back what `save_replay` added, if the state has it. Without replay the limiter starts
    afresh too: no update until --learning-starts rows arrived."""
    if values.get("replay") is None:
        return
    rows = {k.removeprefix("replay."): v for k, v in arrays.items() if k.startswith("replay.")}
    replay.restore(rows, values["replay"])
    limiter.restore({}, values["limiter"])
