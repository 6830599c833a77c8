"""Replay ring, the reference-state pool and the samples-per-insert limiter: pure logic, no
server."""

import dataclasses

import gymnasium as gym
import numpy as np
import pytest

from clusterenv.learner.agents import build_agent
from clusterenv.learner.config import TrainConfig
from clusterenv.learner.replay.rate_limiter import RateLimiter
from clusterenv.learner.replay.uniform import ReplayBuffer
from clusterenv.learner.run.publisher import ReferencePool


def rows(start: int, n: int):
    obs = np.arange(start, start + n, dtype=np.float32)[:, None].repeat(2, 1)
    return obs, np.arange(n) % 2, np.ones(n, np.float32), obs + 0.5, np.zeros(n, bool)


def test_ring_wraps_and_keeps_newest():
    rb = ReplayBuffer(10, (2,), np.float32)
    rb.add(*rows(0, 7))
    rb.add(*rows(7, 7))
    assert rb.size == 10 and rb.inserted == 14
    assert sorted(rb.obs[:, 0].tolist()) == list(range(4, 14))
    assert np.array_equal(rb.next_obs[:, 0], rb.obs[:, 0] + 0.5)  # rows stay aligned


def test_the_reference_pool_gives_the_newest_observations_first_with_their_dtype():
    pool = ReferencePool(10, (2, 3), np.dtype(np.uint8))
    for start in (0, 7, 14):
        pool.add(
            np.arange(start, start + 7, dtype=np.uint8)[:, None, None].repeat(2, 1).repeat(3, 2)
        )
    recent = pool.recent(3)
    assert recent.dtype == np.uint8 and recent.shape == (3, 2, 3)
    assert recent[:, 0, 0].tolist() == [20, 19, 18] and pool.size == 10
    assert pool.recent(50)[:, 0, 0].tolist() == list(range(20, 10, -1))  # no more than it holds


def test_replay_and_limiter_save_and_restore_themselves():
    rb, lim = ReplayBuffer(10, (2,), np.float32), RateLimiter(4.0, 10, 8.0)
    rb.add(*rows(0, 7))
    rb.add(*rows(7, 6))
    lim.on_insert(13), lim.on_sample(20)
    rb2, lim2 = ReplayBuffer(10, (2,), np.float32), RateLimiter(4.0, 10, 8.0)
    rb2.restore(*rb.save())
    lim2.restore(*lim.save())
    rng = np.random.default_rng
    for name, a in rb.sample(32, rng(3)).items():
        assert np.array_equal(a, rb2.sample(32, rng(3))[name]), name
    assert (rb2.pos, rb2.size, rb2.inserted) == (3, 10, 13)
    assert (lim2.inserts, lim2.samples) == (13, 20)
    with pytest.raises(ValueError, match="do not fit a buffer of 4"):
        ReplayBuffer(4, (2,), np.float32).restore(*rb.save())


def test_oversized_insert_keeps_last_capacity_rows():
    rb = ReplayBuffer(4, (2,), np.float32)
    rb.add(*rows(0, 9))
    assert sorted(rb.obs[:, 0].tolist()) == [5, 6, 7, 8]


def test_sample_only_from_filled_rows():
    rb = ReplayBuffer(100, (2,), np.float32)
    rb.add(*rows(0, 5))
    batch = rb.sample(256, np.random.default_rng(0))
    assert batch["obs"][:, 0].max() <= 4


def test_limiter_holds_the_ratio():
    lim = RateLimiter(samples_per_insert=4, min_size=10, error_buffer=8)
    assert not lim.can_sample(2)
    assert lim.can_insert(10)
    lim.on_insert(10)
    # At min_size, sampling may run `error_buffer` ahead.
    taken = 0
    while lim.can_sample(2):
        lim.on_sample(2)
        taken += 2
    assert taken == 8
    lim.on_insert(5)
    while lim.can_sample(2):
        lim.on_sample(2)
        taken += 2
    assert taken == 8 + 20  # 5 inserts × 4 samples each
    # Sampling stopped at the band's bottom (diff = target - error); collection may fill the band
    # up to its top (target + error): 2 * error / spi = 4 transitions.
    assert lim.can_insert(4) and not lim.can_insert(5)
    assert not lim.can_insert(1, pending=4)


@pytest.mark.parametrize(
    "algo, chunks_per_task, error_buffer_chunks",
    [("dqn", 1, 4), ("dqn", 8, 4), ("dqn", 4, 1), ("dqn", 1, 0), ("ppo", 8, 4), ("ppo", 4, 0)],
)
def test_dispatch_and_training_never_wait_for_each_other(
    algo, chunks_per_task, error_buffer_chunks
):
    """Whole tasks through the limiter `train` builds: with a task larger than the error buffer
    (8 chunks against 4 once stalled a run at 4k env steps), one side must always be able to move."""
    cfg = TrainConfig.for_algo(algo)
    cfg.dispatch = dataclasses.replace(cfg.dispatch, chunks_per_task=chunks_per_task)
    cfg.collection.error_buffer_chunks = error_buffer_chunks
    space = gym.spaces.Box(-1.0, 1.0, (4,), np.float32)
    limiter = build_agent(cfg, space, gym.spaces.Discrete(2), lambda v: 0).limiter
    task = cfg.collection.chunk_env_steps * chunks_per_task
    batch = cfg.agent.batch_size if algo == "dqn" else cfg.agent.batch_steps
    for _ in range(200):
        moved = False
        if limiter.can_insert(task):  # a task's chunks arrive, every step a transition
            limiter.on_insert(task)
            moved = True
        while (
            limiter.can_sample(batch)
            if algo == "dqn"
            else limiter.inserts - limiter.samples >= batch  # PPO takes whole batches
        ):
            limiter.on_sample(batch)
            moved = True
        assert moved, f"stalled at {limiter.inserts} inserts, {limiter.samples} samples"
