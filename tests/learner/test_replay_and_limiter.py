"""Replay ring and samples-per-insert limiter: pure logic, no server."""

import numpy as np

from clusterenv.learner.rate_limiter import RateLimiter
from clusterenv.learner.replay import ReplayBuffer


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
    assert rb.recent_obs(3)[:, 0].tolist() == [13, 12, 11]


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
