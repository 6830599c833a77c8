"""Atari through make_env: the DQN wrapper stack on a real ROM, on the actor's path."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest

from clusterenv.pipeline.chunks.actor import Actor, make_vector_env
from clusterenv.pipeline.envs import make_env
from clusterenv.pipeline.envs.atari import EpisodicLife
from clusterenv.pipeline.frames import expand

pytest.importorskip("ale_py", reason="needs the atari extra")
pytest.importorskip("cv2", reason="needs the atari extra")


def wrappers(env: gym.Env) -> list[type]:
    found = []
    while isinstance(env, gym.Wrapper):
        found.append(type(env))
        env = env.env
    return found


def random_actions(n: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    return lambda obs: (rng.integers(0, n, len(obs)), {})


def test_training_stack_collects_uint8_stacks_and_clipped_rewards():
    envs = make_vector_env("ALE/Breakout-v5", {}, 2, training=True)
    assert envs.single_observation_space == gym.spaces.Box(0, 255, (4, 84, 84), np.uint8)
    assert envs.single_action_space == gym.spaces.Discrete(4)
    chunk = Actor(envs, seeds=[1, 2]).collect(random_actions(4), 300)
    assert "obs" not in chunk.arrays  # stacks travel as frames, each once (pipeline/frames.py)
    assert len(chunk.arrays["frames"]) < 1.1 * len(chunk.arrays["action"])
    whole = expand(chunk.arrays)
    obs, next_obs = whole["obs"], whole["next_obs"]
    assert obs.dtype == np.uint8 and obs.shape[1:] == (4, 84, 84) and obs.any()
    assert set(np.unique(chunk.arrays["reward"])) <= {-1.0, 0.0, 1.0}
    assert chunk.arrays["reward"].any()  # random play breaks a brick in 300 steps
    # The stack moves by one frame per step.
    first = chunk.arrays["env_index"] == 0
    np.testing.assert_array_equal(next_obs[first][0][:3], obs[first][0][1:])
    # Lives are lost (Breakout has 5): each ends a training episode.
    assert chunk.arrays["terminated"].any() and chunk.episodes


def test_same_seeds_same_frames():
    a = Actor(make_vector_env("ALE/Pong-v5", {}, 1, training=True), [7]).collect(
        random_actions(6, 1), 60
    )
    b = Actor(make_vector_env("ALE/Pong-v5", {}, 1, training=True), [7]).collect(
        random_actions(6, 1), 60
    )
    np.testing.assert_array_equal(expand(a.arrays)["obs"], expand(b.arrays)["obs"])


def test_evaluation_neither_clips_nor_ends_at_a_lost_life():
    train, evaluate = (make_env("ALE/Breakout-v5", {}, training=t) for t in (True, False))
    stack = [gym.wrappers.FrameStackObservation, gym.wrappers.AtariPreprocessing]
    assert wrappers(evaluate)[:2] == stack
    assert wrappers(train)[:4] == [stack[0], gym.wrappers.TransformReward, EpisodicLife, stack[1]]
    for env in (train, evaluate):
        pre = env
        while not isinstance(pre, gym.wrappers.AtariPreprocessing):
            pre = pre.env
        assert (pre.noop_max, pre.frame_skip, pre.screen_size) == (30, 4, (84, 84))
        assert pre.grayscale_obs and not pre.scale_obs and not pre.terminal_on_life_loss
        # The env under it: every frame (the wrapper skips), v5's sticky actions.
        atari = env.unwrapped
        assert atari._frameskip == 1 and atari.ale.getFloat("repeat_action_probability") == 0.25
    # A whole game in evaluation: play until the first lost life, which does not end it.
    evaluate.reset(seed=3)
    fire = random_actions(4, 2)
    lives = evaluate.unwrapped.ale.lives()
    while evaluate.unwrapped.ale.lives() == lives:
        _, _, terminated, truncated, _ = evaluate.step(int(fire(np.zeros(1))[0][0]))
        assert not (terminated or truncated)


def test_a_lost_life_ends_the_training_episode_but_the_game_goes_on():
    env = make_env("ALE/Breakout-v5", {}, training=True)
    env.reset(seed=4)
    act, steps = random_actions(4, 3), 0
    while True:
        _, _, terminated, truncated, info = env.step(int(act(np.zeros(1))[0][0]))
        steps += 1
        if terminated or truncated:
            break
    assert terminated and info["lives"] == 4
    frame = env.unwrapped.ale.getEpisodeFrameNumber()
    _, info = env.reset()  # the vector env's autoreset: no seed
    assert info["lives"] == 4 and env.unwrapped.ale.getEpisodeFrameNumber() > frame
    _, info = env.reset(seed=4)  # a seeded reset starts a new game
    assert info["lives"] == 5


def test_frameskip_is_the_wrappers():
    with pytest.raises(TypeError, match="frameskip"):
        make_env("ALE/Pong-v5", {"frameskip": 4}, training=True)
