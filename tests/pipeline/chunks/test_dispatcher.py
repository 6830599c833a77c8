"""The Dispatcher with a recording send, a settable process count and a fake clock (no server)."""

from __future__ import annotations

import json

import pytest

from clusterenv.pipeline.behaviour import Categorical, EpsilonGreedy
from clusterenv.pipeline.chunks.dispatcher import DispatchConfig, Dispatcher
from clusterenv.pipeline.chunks.request import COLLECT_CHUNK_TASK, ChunkRequest
from tests.fakes import Counter, FakeClock, RecordingSend

TEMPLATE = {
    "run_id": "run-d",
    "env_id": "CartPole-v1",
    "num_envs": 4,
    "steps": 8,
    "seed": 3,
    "sync": "aps:0.05",
}
CHUNK_ENV_STEPS = 4 * 8
CONFIG = DispatchConfig(tasks_per_process=2, lost_after_s=30.0, slots_every_s=0.5)


def always(pending: int) -> bool:
    return True


def make(processes: int = 2, config: DispatchConfig = CONFIG):
    send, alive, clock = RecordingSend(), Counter(processes), FakeClock()
    d = Dispatcher(send, alive, TEMPLATE, CHUNK_ENV_STEPS, config, clock=clock)
    return d, send, alive, clock


def test_keeps_tasks_per_process_times_processes_in_flight():
    d, send, _, _ = make(processes=3)
    assert d.top_up(EpsilonGreedy(0.5), always) == 6
    assert len(d.in_flight) == 6 and len(send.sent) == 6
    assert d.pending_env_steps == 6 * CHUNK_ENV_STEPS
    assert d.top_up(EpsilonGreedy(0.5), always) == 0  # full: nothing more until something arrives
    assert len(send.sent) == 6


def test_no_live_process_no_chunk():
    d, send, _, _ = make(processes=0)
    assert d.top_up(EpsilonGreedy(1.0), always) == 0 and send.sent == []


def test_sends_valid_chunk_requests_under_the_task_name():
    d, send, _, _ = make(processes=1)
    d.top_up(EpsilonGreedy(0.123456789), always)
    assert [name for name, _ in send.sent] == [COLLECT_CHUNK_TASK] * 2
    for i, (_, kwargs) in enumerate(send.sent):
        wire = json.loads(json.dumps(kwargs))  # plain JSON: what Celery carries
        req = ChunkRequest.from_json(wire)
        assert req.chunk_id == i
        assert req.behaviour == EpsilonGreedy(0.123457)  # ε rounded to 6 places
        for key, value in TEMPLATE.items():
            assert getattr(req, key) == value


def test_the_behaviour_value_travels_as_given():
    d, send, _, _ = make(processes=1)
    d.top_up(Categorical(), always)
    reqs = [ChunkRequest.from_json(json.loads(json.dumps(kw))) for _, kw in send.sent]
    assert [r.behaviour for r in reqs] == [Categorical()] * 2
    assert "policy" not in send.sent[0][1] and "epsilon" not in send.sent[0][1]


def test_may_send_sees_the_pending_env_steps_and_can_stop_dispatch():
    d, send, _, _ = make(processes=4)
    asked: list[int] = []

    def may_send(pending: int) -> bool:
        asked.append(pending)
        return pending < 3 * CHUNK_ENV_STEPS

    assert d.top_up(EpsilonGreedy(0.1), may_send) == 3
    assert asked == [0, CHUNK_ENV_STEPS, 2 * CHUNK_ENV_STEPS, 3 * CHUNK_ENV_STEPS]
    assert len(send.sent) == 3 and len(d.in_flight) == 3
    assert d.top_up(EpsilonGreedy(0.1), lambda pending: False) == 0


def test_arrived_frees_a_slot_and_ids_keep_counting():
    d, send, _, _ = make(processes=1)
    d.top_up(EpsilonGreedy(0.1), always)
    d.arrived(0)
    assert set(d.in_flight) == {1}
    assert d.top_up(EpsilonGreedy(0.1), always) == 1
    assert send.sent[-1][1]["chunk_id"] == 2
    d.arrived(99)  # unknown (e.g. a redelivered, written-off chunk): nothing changes
    assert set(d.in_flight) == {1, 2} and d.lost == 0


def test_chunks_are_written_off_after_lost_after_s_and_replaced():
    d, send, _, clock = make(processes=1)
    d.top_up(EpsilonGreedy(0.1), always)  # chunks 0 and 1 at t0
    clock.advance(10.0)
    d.arrived(0)
    d.top_up(EpsilonGreedy(0.1), always)  # chunk 2 at t0 + 10
    clock.advance(20.0)  # chunk 1 is exactly lost_after_s old: not yet lost
    assert d.top_up(EpsilonGreedy(0.1), always) == 0 and d.lost == 0
    clock.advance(0.01)
    assert (
        d.top_up(EpsilonGreedy(0.1), always) == 1
    )  # chunk 1 written off, chunk 3 sent in its place
    assert d.lost == 1 and set(d.in_flight) == {2, 3}
    clock.advance(30.5)
    assert (
        d.top_up(EpsilonGreedy(0.1), always) == 2
    )  # chunk 2 (sent at t0 + 10) and chunk 3 (t0 + 30) lost
    assert d.lost == 3 and set(d.in_flight) == {4, 5}
    d.arrived(1)  # a written-off chunk that turns up late does not free a slot twice
    assert set(d.in_flight) == {4, 5}
    assert d.late == 1  # but is counted late


def test_slots_are_recounted_only_every_slots_every_s():
    d, send, alive, clock = make(processes=1)
    assert d.top_up(EpsilonGreedy(0.1), always) == 2 and alive.calls == 1
    alive.value = 3
    clock.advance(0.5)  # not more than slots_every_s: the old count stands
    assert d.top_up(EpsilonGreedy(0.1), always) == 0 and alive.calls == 1
    assert d.slots() == 1
    clock.advance(0.01)
    assert d.top_up(EpsilonGreedy(0.1), always) == 4 and alive.calls == 2
    assert len(d.in_flight) == 6
    alive.value = 1  # processes went away: in-flight chunks stay, nothing new is sent
    clock.advance(1.0)
    d.arrived(0)
    assert d.top_up(EpsilonGreedy(0.1), always) == 0 and alive.calls == 3
    assert len(d.in_flight) == 5


@pytest.mark.parametrize("per_process", [1, 3])
def test_tasks_per_process_setting(per_process):
    config = DispatchConfig(tasks_per_process=per_process)
    d, send, _, _ = make(processes=2, config=config)
    assert d.top_up(EpsilonGreedy(0.0), always) == 2 * per_process


def test_a_task_carries_chunks_per_task_consecutive_ids_tracked_one_by_one():
    d, send, _, clock = make(processes=1, config=DispatchConfig(chunks_per_task=4))
    pending: list[int] = []
    assert (
        d.top_up(EpsilonGreedy(0.1), lambda p: pending.append(p) or True) == 8
    )  # 2 tasks x 4 chunks
    assert pending == [0, 4 * CHUNK_ENV_STEPS]
    assert d.task_env_steps == 4 * CHUNK_ENV_STEPS
    reqs = [ChunkRequest.from_json(kwargs) for _, kwargs in send.sent]
    assert [(r.chunk_id, r.chunks) for r in reqs] == [(0, 4), (4, 4)]
    assert set(d.in_flight) == set(range(8))
    for chunk_id in (0, 1, 2):
        d.arrived(chunk_id)
    assert (
        d.top_up(EpsilonGreedy(0.1), always) == 0
    )  # three free chunk slots: not room for a task of four
    d.arrived(3)
    assert d.top_up(EpsilonGreedy(0.1), always) == 4 and send.sent[-1][1]["chunk_id"] == 8
    clock.advance(31.0)  # every chunk of both tasks in flight is written off one by one
    assert d.top_up(EpsilonGreedy(0.1), always) == 8 and d.lost == 8
