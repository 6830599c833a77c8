"""Replay ring, the reference-state pool and the samples-per-insert limiter: pure logic, no
server."""

import dataclasses

import gymnasium as gym
import numpy as np
import pytest

from clusterenv.learner.agents import build_agent
from clusterenv.learner.config import TrainConfig
from clusterenv.learner.replay.frames import FrameReplay
from clusterenv.learner.replay.rate_limiter import RateLimiter
from clusterenv.learner.replay.uniform import ReplayBuffer
from clusterenv.learner.run.publisher import ReferencePool
from clusterenv.pipeline.chunks.actor import Actor
from clusterenv.pipeline.spaces import SpaceSpecs
from tests.fakes import CARTPOLE
from tests.pipeline.chunks.test_chunk_pipeline import AtariSized


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
    pool = ReferencePool(10)
    for start in (0, 7, 14):
        obs = np.arange(start, start + 7, dtype=np.uint8)[:, None, None].repeat(2, 1).repeat(3, 2)
        pool.add({"obs": obs, "action": np.zeros(7, np.int64)})
    recent = pool.recent(3)
    assert recent.dtype == np.uint8 and recent.shape == (3, 2, 3)
    assert recent[:, 0, 0].tolist() == [20, 19, 18] and pool.size == 10
    assert pool.recent(50)[:, 0, 0].tolist() == list(range(20, 10, -1))  # no more than it holds


def test_the_reference_pool_rebuilds_stacked_frames_only_for_the_rows_asked_for():
    chunks, _ = stacked_chunks(2, 64)
    pool = ReferencePool(50)
    for compact, _ in chunks:
        pool.add(compact)
    whole = np.concatenate([w["obs"] for _, w in chunks])
    np.testing.assert_array_equal(pool.recent(20), whole[::-1][:20])
    assert pool.size == 50


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
    limiter = build_agent(cfg, CARTPOLE, lambda v: 0).limiter
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


def stacked_chunks(chunks: int, steps: int, seed: int = 0):
    """Chunks of two envs of stacked 84 x 84 frames, as the workers' FrameEncoder sends them, and
    the whole observations they stand for."""
    actor = Actor(atari_sized(), seeds=[seed, seed + 1])
    plain = Actor(atari_sized(), seeds=[seed, seed + 1])
    plain.spaces = SpaceSpecs(plain.spaces.obs, plain.spaces.action)  # whole observations
    return [(actor.collect(random_actions, steps).arrays, plain.collect(random_actions, steps).arrays)
            for _ in range(chunks)], actor.spaces  # fmt: skip


def random_actions(obs: np.ndarray) -> tuple[np.ndarray, dict]:
    return np.random.default_rng(len(obs)).integers(3, size=len(obs)), {}


def atari_sized() -> gym.vector.SyncVectorEnv:
    return gym.vector.SyncVectorEnv(
        [lambda: gym.wrappers.FrameStackObservation(AtariSized(), 4) for _ in range(2)],
        autoreset_mode=gym.vector.AutoresetMode.NEXT_STEP,
    )


def test_frame_replay_stores_each_frame_once_and_samples_the_stacks_the_env_made():
    chunks, spaces = stacked_chunks(4, 64)
    replay = FrameReplay(10_000, 4, spaces.frame, spaces.action.array)
    for compact, _ in chunks:
        replay.insert(compact)
    whole = {k: np.concatenate([w[k] for _, w in chunks]) for k in chunks[0][1]}
    assert replay.size == len(whole["action"]) == replay.inserted
    # Every stored row gives back exactly its observation and next observation.
    rng = np.random.default_rng(0)
    idx = np.arange(replay.size)
    sample = replay.sample(replay.size, rng)  # uniform: compare as sets of rows, by action id
    assert sample["obs"].dtype == np.uint8 and sample["obs"].shape[1:] == (4, 84, 84)
    stored = {(replay.obs_serial[i].tobytes()) for i in idx}
    assert len(stored) == replay.size  # no two rows share an observation's frames by accident
    ring = replay.frame_capacity
    np.testing.assert_array_equal(replay.frames[replay.obs_serial[idx] % ring], whole["obs"])
    np.testing.assert_array_equal(replay.frames[replay.next_serial[idx] % ring], whole["next_obs"])
    # Frames once: about one per transition (each chunk's first stacks, a new episode's frame).
    assert replay.frame_count < 1.3 * replay.size


def test_frame_replay_never_samples_a_row_whose_frames_were_overwritten():
    chunks, spaces = stacked_chunks(6, 64, seed=3)
    replay = FrameReplay(200, 4, spaces.frame, spaces.action.array)
    for compact, _ in chunks:
        replay.insert(compact)
    assert replay.frame_count > replay.frame_capacity  # the ring has wrapped
    newest = {w["obs"][i].tobytes() for _, w in chunks[-3:] for i in range(len(w["obs"]))}
    batch = replay.sample(512, np.random.default_rng(1))
    assert len(batch["obs"]) == 512
    for obs, next_obs in zip(batch["obs"], batch["next_obs"], strict=True):
        assert obs.tobytes() in newest  # a stack the env made, not stale or torn frames
        np.testing.assert_array_equal(obs[1:], next_obs[:-1])  # next obs shifts by one frame


def test_frame_replay_saves_and_restores_itself():
    chunks, spaces = stacked_chunks(2, 32, seed=5)
    a = FrameReplay(1_000, 4, spaces.frame, spaces.action.array)
    for compact, _ in chunks:
        a.insert(compact)
    b = FrameReplay(1_000, 4, spaces.frame, spaces.action.array)
    b.restore(*a.save())
    for name, array in a.sample(64, np.random.default_rng(2)).items():
        np.testing.assert_array_equal(array, b.sample(64, np.random.default_rng(2))[name], name)
    with pytest.raises(ValueError, match="does not fit this replay"):
        FrameReplay(500, 4, spaces.frame, spaces.action.array).restore(*a.save())
