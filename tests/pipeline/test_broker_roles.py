"""The learner's broker seams: each Redis implementation against the real server, and each fake of
tests/fakes.py put through the same script of calls as its Redis twin, with the same results
(what lets the learner's loop be tested in process on the fakes)."""

from __future__ import annotations

import threading
import time
from typing import Any

import numpy as np
import pytest
import redis
from kombu.exceptions import OperationalError

from clusterenv.pipeline.chunks.stream import StreamReader, StreamWriter
from clusterenv.pipeline.chunks.takers import RedisChunkTakers
from clusterenv.pipeline.cluster.registry import WorkerRegistry
from clusterenv.pipeline.cluster.run_flags import RedisRunFlags
from clusterenv.pipeline.cluster.status_board import RedisStatusBoard
from clusterenv.pipeline.connect import BROKER_ERRORS, broker_gone, connect
from clusterenv.pipeline.evaluation.results import RedisEvalResults
from clusterenv.pipeline.keys import RUN_KEYS_TTL_S, RunKeys
from tests.fakes import CARTPOLE, url_of
from tests.inprocess import (
    FakeChunkTakers,
    FakeEvalResults,
    FakeRunFlags,
    FakeStatusBoard,
    FakeTransitions,
    FakeWorkerDirectory,
)

SIDES = ["fake", "redis"]


def server(request: pytest.FixtureRequest) -> redis.Redis:
    """The session's real server, started only for the Redis side of a twin test."""
    return request.getfixturevalue("client")


# --- Run flags ---------------------------------------------------------------------------------


def run_flags(side: str, request: pytest.FixtureRequest, run_id: str):
    """(flags, lose: the broker forgets the run, stopped: whether the stop flag is up)."""
    if side == "fake":
        flags = FakeRunFlags()
        return flags, flags.lose, lambda: flags.stopped
    client, keys = server(request), RunKeys(run_id)
    return (
        RedisRunFlags(client, keys),
        lambda: client.delete(keys.marker, keys.stop),  # a restart without persistence
        lambda: bool(client.exists(keys.stop)),
    )


@pytest.mark.parametrize("side", SIDES)
def test_run_flags_twins_agree(side, request, run_id):
    flags, lose, stopped = run_flags(side, request, run_id)
    seen: list[Any] = [flags.lost()]
    flags.mark_started()
    seen.append((flags.lost(), stopped()))
    lose()
    seen.append(flags.lost())
    flags.mark_started()
    flags.mark_stopped()  # the marker stays until the run's keys expire
    seen.append((flags.lost(), stopped()))
    assert seen == [True, (False, False), True, (False, True)]


def test_mark_stopped_sets_the_stop_key_and_lets_the_run_keys_expire(client, run_id):
    keys = RunKeys(run_id)
    flags = RedisRunFlags(client, keys)
    flags.mark_started()
    client.xadd(keys.stream, {b"x": b"1"})
    client.incr(keys.actor_counter)
    client.set(keys.weights_latest, 3)
    assert client.ttl(keys.marker) == -1  # no expiry while the run lives
    flags.mark_stopped()
    for key in (keys.stop, keys.stream, keys.actor_counter, keys.weights_latest, keys.marker):
        assert RUN_KEYS_TTL_S - 5 <= client.ttl(key) <= RUN_KEYS_TTL_S, key
    assert client.get(keys.stop) == b"1"


# --- Worker directory --------------------------------------------------------------------------


def worker_directory(side: str, request: pytest.FixtureRequest):
    """(directory, announce(hostname, processes, eval_only), withdraw(hostname), baseline counts)."""
    if side == "fake":
        fake = FakeWorkerDirectory()
        return fake, fake.announce, fake.withdraw, (0, 0)
    registry = WorkerRegistry(server(request))

    def announce(hostname: str, processes: int, eval_only: bool = False) -> None:
        registry.announce(hostname, processes, ttl_s=60, eval_only=eval_only)

    # Heartbeats are per broker: count only what this test adds to whatever else is alive.
    base = (registry.alive_processes(), registry.alive_processes(eval_only=True))
    return registry, announce, registry.withdraw, base


@pytest.mark.parametrize("side", SIDES)
def test_worker_directory_twins_agree(side, request, run_id):
    directory, announce, withdraw, (base, base_eval) = worker_directory(side, request)
    a, b, e = (f"{run_id}-{x}" for x in "abe")

    def look() -> tuple:
        counts = (directory.alive_processes() - base, directory.alive_processes(True) - base_eval)
        return counts, [directory.is_alive(h) for h in (a, b, e)]

    seen = [look()]
    announce(a, 4)
    announce(b, 2)
    announce(e, 3, eval_only=True)
    seen.append(look())
    withdraw(b)
    seen.append(look())
    announce(a, 1)  # a worker that restarted with fewer processes
    seen.append(look())
    assert seen == [
        ((0, 0), [False, False, False]),
        ((6, 3), [True, True, True]),
        ((4, 3), [True, False, True]),
        ((1, 3), [True, False, True]),
    ]
    for host in (a, e):
        withdraw(host)


def test_a_lapsed_heartbeat_is_not_alive(client, run_id):
    registry, host = WorkerRegistry(client), f"{run_id}-w"
    registry.announce(host, 2, ttl_s=0.3)
    assert registry.is_alive(host)
    time.sleep(0.5)
    assert not registry.is_alive(host)


# --- Evaluation results ------------------------------------------------------------------------


def eval_results(side: str, request: pytest.FixtureRequest, run_id: str):
    """(results, push(raw): a worker's result, take(field, host): a worker taking a part)."""
    if side == "fake":
        fake = FakeEvalResults()
        return fake, fake.push, fake.take
    client, keys = server(request), RunKeys(run_id)
    # What pipeline/evaluation/runner.py writes, less the expiry.
    return (
        RedisEvalResults(client, keys),
        lambda raw: client.rpush(keys.eval_results, raw),
        lambda field, host: client.hset(keys.eval_takers, field, host),
    )


@pytest.mark.parametrize("side", SIDES)
def test_eval_results_twins_agree(side, request, run_id):
    results, push, take = eval_results(side, request, run_id)
    parts = ["0:0", "0:1", "0:2"]
    seen: list[Any] = [(results.pop(), results.unread(), results.takers(parts))]
    push(b'{"eval": 0, "part": 0}')
    push('{"eval": 0, "part": 1}')
    take("0:2", "w2")
    take("0:0", "w1")
    seen.append((results.unread(), results.takers(parts), results.takers([])))
    seen.append((results.pop(), results.unread()))
    seen.append((results.pop(), results.pop(), results.unread()))
    results.forget(["0:0", "0:1"])
    results.forget([])
    seen.append(results.takers(parts))
    results.forget(["0:2"])
    seen.append(results.takers(parts))
    assert seen == [
        (None, 0, []),
        (2, ["w1", "w2"], []),  # in the order of the fields asked about
        (b'{"eval": 0, "part": 0}', 1),
        (b'{"eval": 0, "part": 1}', None, 0),
        ["w2"],
        [],
    ]


# --- Chunk takers ------------------------------------------------------------------------------


@pytest.mark.parametrize("side", SIDES)
def test_chunk_takers_twins_agree(side, request, run_id):
    # What a worker notes as a task arrives (tasks/collect.py) and what the learner reads.
    takers = (
        FakeChunkTakers() if side == "fake" else RedisChunkTakers(server(request), RunKeys(run_id))
    )
    seen: list[Any] = [takers.takers([0, 1]), takers.takers([])]
    takers.note(range(0, 4), "w1")
    takers.note([4], "w2")
    takers.note([2], "w3")  # a task requeued to another worker: the newest taker
    seen.append(takers.takers([5, 4, 3, 2, 1, 0]))
    takers.forget([0, 1, 9])
    takers.forget([])
    seen.append(takers.takers(list(range(6))))
    assert seen == [
        {},
        {},
        {4: "w2", 3: "w1", 2: "w3", 1: "w1", 0: "w1"},
        {2: "w3", 3: "w1", 4: "w2"},
    ]
    if side == "redis":  # the hash goes with the run's other keys
        assert 0 < server(request).ttl(RunKeys(run_id).chunk_takers) <= RUN_KEYS_TTL_S


# --- Status board ------------------------------------------------------------------------------


def status_board(side: str, request: pytest.FixtureRequest):
    return FakeStatusBoard() if side == "fake" else RedisStatusBoard(server(request))


@pytest.mark.parametrize("side", SIDES)
def test_status_board_twins_agree(side, request, run_id):
    board = status_board(side, request)
    ids = [f"{run_id}-{x}" for x in "abcde"]
    a, b, c, d, e = ids

    def order() -> list[tuple]:
        # Other tests' runs share the server's board.
        mine = [s for s in board.read_all() if s.get("run_id") in ids]
        return [(s["run_id"][-1], s.get("state")) for s in mine]

    board.write(a, {"run_id": a, "state": "running", "updated_at": 10.0})
    board.write(b, {"run_id": b, "state": "running", "updated_at": 30.0})
    board.write(c, {"run_id": c, "state": "running", "updated_at": 20.0, "dir": run_id.encode()})
    board.write(d, {"run_id": d, "state": "old"})  # no `updated_at`: last
    board.write(e, {"run_id": e, "state": "running", "updated_at": 30.0})  # a tie with b
    seen = [order()]
    board.write(a, {"run_id": a, "state": "solved", "updated_at": 40.0})
    seen.append(order())
    seen.append([s["dir"] for s in board.read_all() if s.get("run_id") == c])
    assert seen == [
        [("b", "running"), ("e", "running"), ("c", "running"), ("a", "running"), ("d", "old")],
        [("a", "solved"), ("b", "running"), ("e", "running"), ("c", "running"), ("d", "old")],
        [str(run_id.encode())],  # what JSON cannot hold is written as its str
    ]


def test_status_board_statuses_expire_with_the_run_keys(client, run_id):
    RedisStatusBoard(client).write(run_id, {"run_id": run_id, "updated_at": 1.0})
    assert RUN_KEYS_TTL_S - 5 <= client.ttl(RunKeys(run_id).status) <= RUN_KEYS_TTL_S


def test_status_board_skips_what_is_not_a_status(client, run_id):
    board = RedisStatusBoard(client)
    client.set(RunKeys(f"{run_id}-junk").status, b"\xff not json")
    client.set(RunKeys(f"{run_id}-list").status, b"[1, 2]")
    board.write(run_id, {"run_id": run_id, "updated_at": 5.0})
    mine = [s for s in board.read_all() if str(s.get("run_id", "")).startswith(run_id)]
    assert mine == [{"run_id": run_id, "updated_at": 5.0}]


def test_a_status_write_to_a_gone_broker_raises_a_broker_error():
    gone = redis.Redis(port=1, socket_connect_timeout=0.5)  # nothing listens on port 1
    with pytest.raises(BROKER_ERRORS) as info:
        RedisStatusBoard(gone).write("r", {"run_id": "r"})
    assert broker_gone(info.value)
    board = FakeStatusBoard()
    board.error = redis.ConnectionError("gone")
    with pytest.raises(BROKER_ERRORS):
        board.write("r", {"run_id": "r"})


# --- The broker error seam ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "exc, is_broker_error, gone",
    [
        (redis.ConnectionError("refused"), True, True),
        (redis.TimeoutError("timed out"), True, True),
        (redis.AuthenticationError("WRONGPASS"), True, True),  # a ConnectionError in redis-py
        (OperationalError("Error 111 connecting"), True, True),  # a Celery send, retries spent
        (redis.ResponseError("BUSY a script is running"), True, False),
        (redis.ResponseError("OOM command not allowed"), True, False),
        (ValueError("bad chunk"), False, False),
        (KeyboardInterrupt(), False, False),
    ],
)
def test_broker_errors_and_broker_gone(exc, is_broker_error, gone):
    assert isinstance(exc, BROKER_ERRORS) == is_broker_error
    assert broker_gone(exc) == gone


# --- Transitions -------------------------------------------------------------------------------


def chunk(run_id: str, chunk_id: int, rows: int) -> tuple[dict, dict[str, np.ndarray]]:
    obs = np.arange(rows * 4, dtype=np.float32).reshape(rows, 4)
    header = {"run": run_id, "chunk": chunk_id, "policy_version": 0, "worker": "w"}
    arrays = {
        "obs": obs, "action": np.arange(rows) % 2, "reward": np.ones(rows, np.float32),
        "next_obs": obs + 1, "terminated": np.zeros(rows, bool), "truncated": np.zeros(rows, bool),
        "env_index": np.zeros(rows, np.int32),
    }  # fmt: skip
    return header, arrays


def transitions(side: str, request: pytest.FixtureRequest, run_id: str):
    """(writer, reader) of one run's chunks."""
    if side == "fake":
        fake = FakeTransitions()
        return fake, fake
    client, keys = server(request), RunKeys(run_id)
    reader = StreamReader(connect(url_of(client), blocking=True), keys, CARTPOLE)
    return StreamWriter(client, keys), reader


@pytest.mark.parametrize("side", SIDES)
def test_transitions_twins_agree(side, request, run_id):
    writer, reader = transitions(side, request, run_id)
    got: list[tuple[int, list[int]]] = []

    def sink(header: dict, arrays: dict[str, np.ndarray]) -> None:
        got.append((header["chunk"], arrays["action"].tolist()))

    def stats() -> tuple:
        s = reader.stats
        return s.chunks, s.transitions, s.duplicates, set(reader.seen)

    seen: list[Any] = [reader.poll(sink, block_ms=10)]
    for chunk_id, rows in [(0, 3), (1, 2), (0, 3), (2, 1)]:  # chunk 0 twice: a redelivery
        assert writer.write(*chunk(run_id, chunk_id, rows)) > 0
    seen.append((reader.poll(sink, block_ms=10, count=2), stats()))
    seen.append((reader.poll(sink, block_ms=10), stats()))
    seen.append((reader.poll(sink, block_ms=10), reader.claim_stale(sink, min_idle_ms=0)))
    assert seen == [
        0,
        (5, (2, 5, 0, {0, 1})),
        (1, (3, 6, 1, {0, 1, 2})),
        (0, 0),
    ]
    assert got == [(0, [0, 1, 0]), (1, [0, 1]), (2, [0])]


def test_fake_transitions_keep_a_chunk_whose_sink_raised(run_id):
    fake = FakeTransitions()
    fake.write(*chunk(run_id, 0, 2))
    fake.write(*chunk(run_id, 1, 2))

    def failing(header: dict, arrays: dict) -> None:
        raise RuntimeError("replay full")

    with pytest.raises(RuntimeError):
        fake.poll(failing)
    assert [h["chunk"] for h, _ in fake.queued] == [0, 1] and not fake.seen
    assert fake.poll(lambda h, a: None) == 4


def test_fake_transitions_poll_wakes_on_a_write(run_id):
    fake = FakeTransitions()
    got: list[int] = []
    timer = threading.Timer(0.05, lambda: fake.write(*chunk(run_id, 7, 1)))
    timer.start()
    start = time.monotonic()
    assert fake.poll(lambda h, a: got.append(h["chunk"]), block_ms=5000) == 1
    assert got == [7] and time.monotonic() - start < 2.0
    timer.join()
