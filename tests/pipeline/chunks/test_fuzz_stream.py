"""Fuzzed entries XADDed into a real stream, read by the learner's real ingest thread into a real
replay buffer: each broken entry is counted under a named reason, none of its rows reaches
replay, every good chunk does, and the stream is left with nothing pending."""

from __future__ import annotations

import time
import uuid

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from clusterenv.learner.dqn.config import DQNConfig
from clusterenv.learner.dqn.learning import DQNLearner
from clusterenv.learner.replay.rate_limiter import RateLimiter
from clusterenv.learner.replay.uniform import ReplayBuffer
from clusterenv.learner.run.ingest import Ingest
from clusterenv.pipeline.chunks.stream import StreamReader
from clusterenv.pipeline.connect import connect
from clusterenv.pipeline.keys import RunKeys
from tests.bad_input import NUM_ACTIONS, OBS_SHAPE, POISON, SPACES, bad_entry, entry


@st.composite
def entries(draw: st.DrawFn, run_id: str, most: int) -> list[tuple[dict[bytes, bytes], int]]:
    """Good and broken entries mixed; (fields, rows) with rows = 0 for an entry to refuse."""
    out = []
    for chunk in range(draw(st.integers(1, most))):
        if draw(st.booleans()):
            rows = draw(st.integers(1, 6))
            out.append((entry(run_id, chunk, rows, fill=chunk + 1.0), rows))
        else:
            out.append((draw(bad_entry(run_id, chunk)), 0))
    return out


def ingest_all(redis_url: str, run_id: str, batch: list[tuple[dict[bytes, bytes], int]]):
    keys = RunKeys(run_id)
    client = connect(redis_url)
    reader = StreamReader(
        connect(redis_url, blocking=True), keys, SPACES,
    )  # fmt: skip
    replay = ReplayBuffer(1000, OBS_SHAPE, np.float32)
    dqn = DQNLearner(OBS_SHAPE, NUM_ACTIONS, DQNConfig(hidden="8"), replay,
                     RateLimiter(1.0, 1, 1e9), seed=0)  # fmt: skip
    ingest = Ingest(reader, dqn.insert, lambda v: (0, 0), 30.0)  # the learner's own insert
    try:
        for fields, _ in batch:
            client.xadd(keys.stream, fields)
        ingest.start()
        deadline = time.monotonic() + 20
        while reader.stats.chunks + reader.stats.rejected < len(batch):
            assert ingest.error is None, ingest.error
            assert time.monotonic() < deadline, f"stuck at {reader.stats}"
            time.sleep(0.02)
        ingest.stop()
        assert ingest.error is None  # the thread met every entry and is still well
        pending = client.xpending(keys.stream, keys.group)["pending"]
        left = client.xlen(keys.stream)
    finally:
        ingest.stop()
        client.delete(keys.stream)
    return reader.stats, replay, pending, left


def check(stats, replay, pending, left, batch) -> None:
    bad = sum(1 for _, rows in batch if rows == 0)
    assert stats.rejected == bad and sum(stats.rejected_reasons.values()) == bad
    assert all(reason for reason in stats.rejected_reasons)
    assert stats.chunks == len(batch) - bad
    assert replay.inserted == stats.transitions == sum(rows for _, rows in batch)
    held = replay.obs[: replay.size]
    assert not (held == POISON).any(), "a row of a rejected entry reached replay"
    # Every good chunk's rows, and only those: chunk c's obs are all c + 1.
    want = sorted(v for c, (_, rows) in enumerate(batch) for v in [c + 1.0] * rows)
    assert sorted(held[:, 0].tolist()) == want
    assert pending == 0 and left == 0


def fuzz(redis_url: str, examples: int, most: int) -> None:
    @settings(max_examples=examples, deadline=None, suppress_health_check=list(HealthCheck))
    @given(st.data())
    def run(data):
        run_id = f"fuzz-{uuid.uuid4().hex[:10]}"
        batch = data.draw(entries(run_id, most))
        check(*ingest_all(redis_url, run_id, batch), batch)

    run()


def test_fuzzed_entries_through_the_real_ingest_path(redis_url):
    fuzz(redis_url, examples=15, most=12)


@pytest.mark.slow
def test_many_fuzzed_entries_through_the_real_ingest_path(redis_url):
    fuzz(redis_url, examples=150, most=40)
