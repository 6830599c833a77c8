"""The ingest thread: a failing read is retried with backoff, then stops ingest with its error."""

from __future__ import annotations

import time

import numpy as np
import redis

from clusterenv.learner.replay.uniform import ReplayBuffer
from clusterenv.learner.run.ingest import Ingest
from tests.fakes import FlakyReader


def one_chunk(rows: int = 8) -> tuple[dict, dict[str, np.ndarray]]:
    obs = np.ones((rows, 4), np.float32)
    arrays = {"obs": obs, "next_obs": obs, "action": np.zeros(rows, np.int64),
              "reward": np.ones(rows, np.float32), "terminated": np.zeros(rows, bool)}  # fmt: skip
    return {"chunk": 0, "policy_version": 0, "worker": "w"}, arrays


def ingest_from(
    reader: FlakyReader, stale_after_s: float = 30.0, **retry
) -> tuple[Ingest, ReplayBuffer]:
    replay = ReplayBuffer(64, (4,), np.dtype(np.float32))

    def store(header: dict, a: dict[str, np.ndarray]) -> int:  # what a learner's insert does
        replay.add(a["obs"], a["action"], a["reward"], a["next_obs"], a["terminated"])
        return len(a["action"])

    return Ingest(reader, store, lambda v: (0, 0), stale_after_s, **retry), replay


def wait_until(condition, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def test_a_failing_read_is_retried_with_backoff_and_ingest_goes_on():
    reader = FlakyReader(3, redis.ResponseError("BUSY a script is running"), [one_chunk()])
    ingest, replay = ingest_from(reader, retries=5, backoff_s=0.05, backoff_cap_s=0.1)
    ingest.start()
    try:
        wait_until(lambda: replay.size == 8)
    finally:
        ingest.stop()
    assert ingest.error is None and ingest.retried == 3
    assert [a.transitions for a in ingest.arrivals()] == [8]
    gaps = np.diff(reader.polls[:4])
    assert (gaps >= np.array([0.05, 0.1, 0.1]) * 0.9).all(), gaps  # doubling, capped


def test_a_read_that_keeps_failing_stops_ingest_with_its_error():
    error = redis.ResponseError("WRONGTYPE Operation against a key holding the wrong kind of value")
    reader = FlakyReader(10**6, error, [])
    ingest, _ = ingest_from(reader, retries=3, backoff_s=0.01, backoff_cap_s=0.02)
    ingest.start()
    wait_until(lambda: ingest.error is not None)
    ingest.stop()
    assert ingest.error is error and ingest.retried == 3 and len(reader.polls) == 4
    assert not ingest._thread.is_alive()


def test_a_connection_the_client_could_not_restore_is_not_retried_again():
    # The Redis client has already retried it for about half a minute (pipeline/connect.py).
    reader = FlakyReader(10**6, redis.ConnectionError("Connection refused"), [])
    ingest, _ = ingest_from(reader, retries=3, backoff_s=0.01)
    ingest.start()
    wait_until(lambda: ingest.error is not None)
    ingest.stop()
    assert len(reader.polls) == 1 and ingest.retried == 0


def test_chunks_are_claimed_after_the_write_off_time_ingest_was_given():
    # The trainer gives the dispatcher's --lost-after-s: no default of its own that could drift.
    reader = FlakyReader(0, RuntimeError("unused"), [])
    ingest, _ = ingest_from(reader, stale_after_s=12.5, claim_every_s=0.0)
    ingest.start()
    try:
        wait_until(lambda: len(reader.claims) >= 2)
    finally:
        ingest.stop()
    assert set(reader.claims) == {12_500}
