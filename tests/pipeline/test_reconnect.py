"""Clients ride out a broker restart; the stream reader rebuilds its lost group and takes over
chunks a dead reader never acked. Against a real redis-server of the test's own."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from clusterenv.pipeline.chunks.stream import StreamReader, StreamWriter
from clusterenv.pipeline.connect import RedisUnreachable, connect
from clusterenv.pipeline.keys import RunKeys
from tests.fakes import CARTPOLE
from tests.servers import PrivateRedis

pytestmark = pytest.mark.timeout(60)


def chunk(n: int = 3) -> dict[str, np.ndarray]:
    return {
        "obs": np.zeros((n, 4), np.float32), "action": np.ones(n, np.int64),
        "reward": np.ones(n, np.float32), "next_obs": np.zeros((n, 4), np.float32),
        "terminated": np.zeros(n, bool), "truncated": np.zeros(n, bool),
        "env_index": np.zeros(n, np.int32),
    }  # fmt: skip


def header(run_id: str, chunk_id: int) -> dict:
    return {"run": run_id, "chunk": chunk_id, "worker": "w", "policy_version": 0}


def reader(url: str, keys: RunKeys, consumer: str = "learner-0") -> StreamReader:
    return StreamReader(connect(url, blocking=True), keys, CARTPOLE, consumer=consumer)


def test_a_command_during_a_broker_restart_waits_for_it_and_succeeds():
    with PrivateRedis() as server:
        client = connect(server.url)
        client.set("k", "before")
        server.stop()  # down now; back in 1.5 s
        restart = threading.Timer(1.5, server.start)
        restart.start()
        try:
            # Issued while the server is down: the client retries with backoff until it is back
            # (a new, empty server: "before" is gone).
            t0 = time.monotonic()
            client.set("k", "after")
            assert time.monotonic() - t0 >= 1.0  # it did wait for the server
            assert client.get("k") == b"after"
        finally:
            restart.join()


def test_an_unreachable_url_fails_at_once_with_one_line():
    with PrivateRedis() as server:
        url = server.url
    with pytest.raises(RedisUnreachable, match=f"cannot reach Redis at {url}"):
        connect(url)


def test_the_reader_rebuilds_a_lost_group_and_goes_on():
    with PrivateRedis() as server:
        keys = RunKeys("restart")
        r = reader(server.url, keys)
        writer = StreamWriter(connect(server.url), keys)
        got: list[int] = []
        writer.write(header("restart", 0), chunk())
        assert r.poll(lambda h, a: got.append(h["chunk"])) == 3
        server.restart(0.2)  # the stream and its consumer group are gone
        assert r.poll(lambda h, a: got.append(h["chunk"])) == 0
        assert r.groups_created == 2
        writer.write(header("restart", 1), chunk())
        writer.write(header("restart", 0), chunk())  # a redelivery of an accepted chunk
        while r.stats.chunks + r.stats.duplicates < 3:
            r.poll(lambda h, a: got.append(h["chunk"]))
        assert got == [0, 1] and r.stats.duplicates == 1


def test_chunks_a_dead_reader_took_are_claimed_and_ingested_once():
    with PrivateRedis() as server:
        keys = RunKeys("claim")
        writer = StreamWriter(connect(server.url), keys)
        dead = reader(server.url, keys, consumer="learner-dead")
        for i in range(3):
            writer.write(header("claim", i), chunk())

        def crash(h, a):
            raise RuntimeError("the reader died before its ack")

        with pytest.raises(RuntimeError):
            dead.poll(crash)  # all three delivered to `dead`, none acked
        alive = reader(server.url, keys)
        got: list[int] = []
        assert alive.poll(lambda h, a: got.append(h["chunk"])) == 0  # nothing new to read
        assert alive.claim_stale(lambda h, a: got.append(h["chunk"]), min_idle_ms=0) == 9
        assert sorted(got) == [0, 1, 2] and alive.stats.claimed == 3
        assert alive.claim_stale(lambda h, a: got.append(h["chunk"]), min_idle_ms=0) == 0
        assert connect(server.url).xlen(keys.stream) == 0  # acked and deleted
