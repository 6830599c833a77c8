"""Stacked frames travel once each (pipeline/frames.py): what the learner rebuilds is exactly what
the env observed, across episode ends and autoresets, and never a stack of two episodes."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from clusterenv.pipeline.chunks.actor import Actor
from clusterenv.pipeline.codec import CodecError
from clusterenv.pipeline.frames import FrameEncoder, check_indexes, expand, observations
from clusterenv.pipeline.spaces import SpaceSpecs, stack_depth

K = 3


class Frames(gym.Env):
    """2 × 3 uint8 frames that name their episode and step (frame = [episode, step, ...]);
    episodes of 1–6 steps drawn from the seed, ending terminated or truncated."""

    observation_space = gym.spaces.Box(0, 255, (2, 3), np.uint8)
    action_space = gym.spaces.Discrete(2)

    def __init__(self) -> None:
        self.episode, self.t, self.length = -1, 0, 1

    def frame(self) -> np.ndarray:
        return np.full((2, 3), (self.episode * 16 + self.t) % 256, np.uint8)

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        self.episode, self.t = self.episode + 1, 0
        self.length = int(self.np_random.integers(1, 7))
        return self.frame(), {}

    def step(self, action):
        self.t += 1
        end = self.t >= self.length
        truncated = end and bool(self.np_random.integers(2))
        return self.frame(), 1.0, end and not truncated, truncated, {}


def stacked_envs(n: int) -> gym.vector.SyncVectorEnv:
    return gym.vector.SyncVectorEnv(
        [lambda: gym.wrappers.FrameStackObservation(Frames(), K) for _ in range(n)],
        autoreset_mode=gym.vector.AutoresetMode.NEXT_STEP,
    )


def random_actions(obs: np.ndarray):
    return np.zeros(len(obs), np.int64), {}


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_actor_sends_frames_once_and_the_learner_rebuilds_every_observation(seed):
    stacked = Actor(stacked_envs(3), seeds=[seed, seed + 1, seed + 2])
    plain = Actor(stacked_envs(3), seeds=[seed, seed + 1, seed + 2])
    assert stacked.spaces.stack == K
    plain.spaces = SpaceSpecs(plain.spaces.obs, plain.spaces.action)  # whole observations
    for _ in range(4):  # chunks in a row: episodes continue across their boundaries
        compact, whole = stacked.collect(random_actions, 10), plain.collect(random_actions, 10)
        assert "obs" not in compact.arrays and compact.arrays["frames"].dtype == np.uint8
        rebuilt = expand(compact.arrays)
        for name, array in whole.arrays.items():
            np.testing.assert_array_equal(rebuilt[name], array, err_msg=name)
        # Never two episodes in one stack: every frame of an observation names one episode.
        for obs in (rebuilt["obs"], rebuilt["next_obs"]):
            episodes = obs[:, :, 0, 0] // 16
            assert (episodes == episodes[:, :1]).all()
        # Each frame once: the chunk's first stacks whole, then about one frame per step.
        frames, rows = len(compact.arrays["frames"]), 3 * 10
        assert frames < 3 * K + rows + K * len(compact.episodes) + 3 * K


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.integers(0, 255)), min_size=1, max_size=40),
       st.integers(1, 5))  # fmt: skip
def test_any_sequence_of_stacks_is_rebuilt_exactly(steps, k):
    """Per step: a new episode (a stack that is not a shift, padded with its first frame) or the
    next frame; the indexes always rebuild the stacks the env produced."""
    stack = np.zeros((1, k, 2), np.uint8)
    encoder = FrameEncoder(stack)
    seen = [(encoder.current(), stack.copy())]
    for reset, value in steps:
        frame = np.full((1, 1, 2), value, np.uint8)
        stack = frame.repeat(k, 1) if reset else np.concatenate([stack[:, 1:], frame], axis=1)
        seen.append((encoder.advance(stack), stack.copy()))
    frames = encoder.array((2,), np.dtype(np.uint8))
    for index, expected in seen:
        np.testing.assert_array_equal(frames[index], expected)
    assert len(frames) <= k + sum(k if reset else 1 for reset, _ in steps)


def test_an_index_outside_the_chunks_frames_is_refused_by_name():
    arrays = {"frames": np.zeros((4, 2, 3), np.uint8),
              "obs_frames": np.array([[0, 1, 2]], np.int32),
              "next_frames": np.array([[1, 2, 4]], np.int32)}  # fmt: skip
    with pytest.raises(CodecError, match="'next_frames': indexes outside the chunk's 4 frames"):
        check_indexes(arrays)
    arrays["next_frames"] = np.array([[1, 2, -1]], np.int32)
    with pytest.raises(CodecError, match="next_frames"):
        check_indexes(arrays)


def test_the_stack_depth_is_read_off_the_wrappers():
    assert stack_depth(gym.wrappers.FrameStackObservation(Frames(), 4)) == 4
    assert stack_depth(Frames()) == 0
    # An observation wrapper outside the stack changes what the observations are: not stacks.
    outer = gym.wrappers.TransformObservation(
        gym.wrappers.FrameStackObservation(Frames(), 4), lambda o: o, None
    )
    assert stack_depth(outer) == 0


def test_the_newest_observations_of_a_chunk_and_none_for_zero():
    arrays = {"frames": np.arange(5, dtype=np.uint8)[:, None].repeat(2, 1),
              "obs_frames": np.array([[0, 1], [1, 2], [3, 4]], np.int32),
              "action": np.zeros(3, np.int64)}  # fmt: skip
    assert observations(arrays, 2)[:, :, 0].tolist() == [[1, 2], [3, 4]]
    assert observations(arrays, 0).shape == (0, 2, 2)
    assert observations({"obs": np.arange(3), "action": np.zeros(3)}, 5).tolist() == [0, 1, 2]
