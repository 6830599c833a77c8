"""A user's env that raises or hangs, in the Actor and the vector env the workers build (no
server): the chunk ends at the fault with the steps before it, and the fault says where."""

from __future__ import annotations

import signal
import threading
import time

import gymnasium as gym
import numpy as np
import pytest

from clusterenv.pipeline.chunks.actor import Actor, make_vector_env
from clusterenv.pipeline.envs.faults import EnvFault, NameFaults, TimeLimitHit, time_limit
from tests.pipeline.chunks.test_actor import Countdown, act_by_parity, by_env


class Breaks(Countdown):
    """Countdown whose `fail_at`-th call of `method` (counted over the env's life) raises, or
    sleeps `hang_s` first when `hang_s` is set (a stall the time limit must cut off)."""

    def __init__(self, length: int, method: str, fail_at: int, hang_s: float = 0.0):
        super().__init__(length)
        self.method, self.fail_at, self.hang_s, self.calls = method, fail_at, hang_s, 0

    def _maybe_fail(self, method: str) -> None:
        if method != self.method:
            return
        self.calls += 1
        if self.calls == self.fail_at:
            if self.hang_s:
                time.sleep(self.hang_s)
            raise ValueError(f"{method} number {self.calls} broke")

    def reset(self, *, seed=None, options=None):
        self._maybe_fail("reset")
        return super().reset(seed=seed, options=options)

    def step(self, action):
        self._maybe_fail("step")
        return super().step(action)


def vector(*envs: gym.Env) -> gym.vector.SyncVectorEnv:
    return gym.vector.SyncVectorEnv(
        [lambda e=e: NameFaults(e) for e in envs], autoreset_mode=gym.vector.AutoresetMode.NEXT_STEP
    )


def test_a_step_that_raises_ends_the_chunk_with_the_steps_before_it():
    # Env 1 raises on its 5th step: steps 1-4 of both envs are kept, step 5 (env 0 was already
    # stepped in it) is not; env 0's episode of 3 finished at step 3 and is reported.
    actor = Actor(vector(Countdown(3), Breaks(10, "step", 5)), seeds=[0, 1])
    chunk = actor.collect(act_by_parity, steps=8)
    assert chunk.fault is not None and chunk.fault.kind == "step"
    assert chunk.fault.error == "ValueError: step number 5 broke"
    assert chunk.env_steps == 2 * 4
    assert by_env(chunk.arrays, "obs", 1) == [[0.0], [1.0], [2.0], [3.0]]
    assert by_env(chunk.arrays, "obs", 0) == [[0.0], [1.0], [2.0]]  # step 4 was its reset step
    assert {len(v) for v in chunk.arrays.values()} == {7}
    assert chunk.episodes == [(6.0, 3)]


def test_a_reset_inside_the_autoreset_is_named_reset():
    # The 2nd reset is the autoreset after the first episode (3 steps): at vector step 4.
    actor = Actor(vector(Breaks(3, "reset", 2)), seeds=[0])
    chunk = actor.collect(act_by_parity, steps=6)
    assert chunk.fault is not None and chunk.fault.kind == "reset"
    assert chunk.env_steps == 3 and len(chunk.arrays["action"]) == 3
    assert chunk.episodes == [(6.0, 3)]


def test_a_fault_on_the_first_step_leaves_an_empty_chunk():
    chunk = Actor(vector(Breaks(5, "step", 1)), seeds=[0]).collect(act_by_parity, steps=4)
    assert chunk.fault is not None and chunk.fault.kind == "step"
    assert chunk.env_steps == 0 and {len(v) for v in chunk.arrays.values()} == {0}


def test_a_hung_step_is_cut_off_at_the_chunks_time_limit():
    actor = Actor(vector(Breaks(50, "step", 3, hang_s=30.0)), seeds=[0])
    t0 = time.monotonic()
    chunk = actor.collect(act_by_parity, steps=10, time_limit_s=0.5)
    assert time.monotonic() - t0 < 5.0
    assert chunk.fault is not None and chunk.fault.kind == "hang"
    assert "0.5 s" in chunk.fault.error
    assert chunk.env_steps == 2 and by_env(chunk.arrays, "obs", 0) == [[0.0], [1.0]]


def test_the_time_limit_leaves_no_alarm_behind_and_gives_an_outer_timer_back():
    before = signal.getsignal(signal.SIGALRM)
    signal.setitimer(signal.ITIMER_REAL, 100.0)  # as pytest-timeout arms one
    try:
        with time_limit(0.2):
            time.sleep(0.01)
        assert signal.getsignal(signal.SIGALRM) is before
        left, _ = signal.getitimer(signal.ITIMER_REAL)
        assert 99.0 < left <= 100.0  # the outer timer, with what it had left
        with pytest.raises(TimeLimitHit), time_limit(0.05):
            time.sleep(5)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)


def test_the_time_limit_is_off_outside_the_main_thread():
    seen: list[BaseException] = []

    def run() -> None:
        try:
            with time_limit(0.05):
                time.sleep(0.2)
        except BaseException as exc:  # noqa: BLE001 - the test looks at anything that escaped
            seen.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    assert not seen


def test_an_env_that_cannot_be_made_is_a_make_fault():
    with pytest.raises(EnvFault) as info:
        make_vector_env("CartPole-v1", {"no_such_argument": 1}, 2, training=True)
    assert info.value.kind == "make" and "no_such_argument" in info.value.error


def test_a_flaky_env_at_rate_one_fails_where_its_rates_say():
    from bench.envs import FLAKY_CARTPOLE

    envs = make_vector_env(FLAKY_CARTPOLE, {"reset_crash_p": 1.0}, 2, training=True)
    with pytest.raises(EnvFault) as info:
        Actor(envs, seeds=[0, 1])
    assert (
        info.value.kind == "reset"
        and info.value.error == "SimulatedCrash: simulated crash in reset"
    )
    envs = make_vector_env(FLAKY_CARTPOLE, {"step_crash_p": 1.0}, 2, training=True)
    chunk = Actor(envs, seeds=[0, 1]).collect(lambda obs: (np.zeros(len(obs), np.int64), {}), 4)
    assert chunk.fault is not None and chunk.fault.kind == "step" and chunk.env_steps == 0


def test_a_stop_between_steps_ends_the_chunk_whole_and_preempted():
    calls = iter(range(100))
    actor = Actor(vector(Countdown(10), Countdown(10)), seeds=[0, 1])
    chunk = actor.collect(act_by_parity, steps=8, stop=lambda: next(calls) >= 3)
    assert chunk.preempted and chunk.fault is None
    assert chunk.env_steps == 2 * 3 and by_env(chunk.arrays, "obs", 1) == [[0.0], [1.0], [2.0]]
    # The actor is whole: the next chunk goes on from step 3.
    assert by_env(actor.collect(act_by_parity, steps=2).arrays, "obs", 0) == [[3.0], [4.0]]
