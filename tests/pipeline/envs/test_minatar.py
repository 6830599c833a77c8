"""MinAtar through make_env: uint8 channel-first observations, seeded resets, Gymnasium's checker."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

from clusterenv.pipeline.chunks.actor import Actor, make_vector_env
from clusterenv.pipeline.envs import make_env

pytest.importorskip("minatar", reason="needs the minatar extra")

# Channels per game (MinAtar's state shapes) and actions of -v1 (the minimal action set).
GAMES = {"Asterix": (4, 5), "Breakout": (4, 3), "Freeway": (7, 3), "Seaquest": (10, 6),
         "SpaceInvaders": (6, 4)}  # fmt: skip


def play(env: gym.Env, seed: int, steps: int) -> tuple[np.ndarray, list[float]]:
    """Observations and rewards of a fixed action sequence from reset(seed), resetting (unseeded)
    at each episode's end."""
    obs, _ = env.reset(seed=seed)
    seen, rewards = [obs], []
    for t in range(steps):
        obs, reward, terminated, truncated, _ = env.step((t * 7 // 3) % env.action_space.n)
        seen.append(obs)
        rewards.append(reward)
        if terminated or truncated:
            obs, _ = env.reset()
            seen.append(obs)
    return np.stack(seen), rewards


@pytest.mark.parametrize("game", GAMES)
def test_spaces_are_uint8_channel_first(game):
    channels, actions = GAMES[game]
    env = make_env(f"MinAtar/{game}-v1", {}, training=True)
    assert env.observation_space == gym.spaces.Box(0, 1, (channels, 10, 10), np.uint8)
    assert env.action_space == gym.spaces.Discrete(actions)
    obs, _ = env.reset(seed=0)
    assert obs.dtype == np.uint8 and obs.shape == (channels, 10, 10)
    assert set(np.unique(obs)) <= {0, 1} and obs.any()
    assert make_env(f"MinAtar/{game}-v0", {}, training=True).action_space == gym.spaces.Discrete(6)


def test_observation_is_minatar_state_transposed():
    env = make_env("MinAtar/Breakout-v1", {}, training=True)
    obs, _ = env.reset(seed=3)
    np.testing.assert_array_equal(obs, env.unwrapped.game.state().transpose(2, 0, 1))


@pytest.mark.parametrize("game", ["Breakout", "Seaquest", "Asterix"])
def test_same_seed_same_observations_and_rewards(game):
    env = make_env(f"MinAtar/{game}-v1", {}, training=True)
    first_obs, first_rewards = play(env, seed=11, steps=300)
    # The same env again, after other episodes (MinAtar keeps its sticky last action and RNG
    # across its own resets), and a fresh one: both replay the seeded episode.
    play(env, seed=99, steps=57)
    again_obs, again_rewards = play(env, seed=11, steps=300)
    fresh_obs, fresh_rewards = play(make_env(f"MinAtar/{game}-v1", {}, training=True), 11, 300)
    for obs, rewards in ((again_obs, again_rewards), (fresh_obs, fresh_rewards)):
        np.testing.assert_array_equal(obs, first_obs)
        assert rewards == first_rewards
    other_obs, _ = play(env, seed=12, steps=300)
    assert not np.array_equal(other_obs, first_obs)


def test_an_episode_does_not_inherit_the_last_action_of_the_one_before():
    # Every action sticky: the paddle moves only by the action MinAtar holds as its last one, which
    # its own reset keeps; as if the previous episode had ended moving right, and then reset.
    env = make_env("MinAtar/Breakout-v1", {"sticky_action_prob": 1.0}, training=True)
    env.reset(seed=1)
    env.unwrapped.game.last_action = env.unwrapped.actions[2]  # right
    start, _ = env.reset(seed=1)
    for _ in range(3):
        obs, *_ = env.step(2)
    np.testing.assert_array_equal(obs[0], start[0])  # channel 0: the paddle, unmoved


def test_gymnasiums_env_checker_passes():
    env = make_env("MinAtar/Breakout-v1", {}, training=True)
    check_env(env.unwrapped)
    check_env(
        make_env("MinAtar/Seaquest-v1", {}, training=False, render_mode="rgb_array").unwrapped
    )


def test_rgb_frames_are_uint8():
    env = make_env("MinAtar/Breakout-v1", {}, training=False, render_mode="rgb_array")
    env.reset(seed=0)
    frame = env.render()
    assert frame.dtype == np.uint8 and frame.shape == (160, 160, 3) and frame.any()


def test_the_actors_vector_env_collects_uint8_frames():
    actor = Actor(make_vector_env("MinAtar/Breakout-v1", {}, 2, training=True), seeds=[1, 2])
    rng = np.random.default_rng(0)
    chunk = actor.collect(lambda obs: (rng.integers(0, 3, len(obs)), {}), 200)
    assert chunk.arrays["obs"].dtype == np.uint8 and chunk.arrays["obs"].shape[1:] == (4, 10, 10)
    assert chunk.episodes and chunk.arrays["terminated"].any()


def test_unknown_game_and_bad_kwargs():
    with pytest.raises(gym.error.Error, match="not a MinAtar game.*MinAtar/Breakout-v1"):
        make_env("MinAtar/Pong-v1", {}, training=True)
    with pytest.raises(TypeError):
        make_env("MinAtar/Breakout-v1", {"no_such_option": 1}, training=True)


def test_the_expensive_pixel_env_of_the_benchmarks_is_breakout_plus_its_sleep():
    """bench.envs' MinAtar/SlowBreakout-v1 (issue 30's expensive pixel env): Breakout's
    observations and the same episode for the same seed and actions, each step `delay_s` longer;
    it takes the MinAtar preset."""
    import time

    from bench.envs import SLOW_MINATAR_BREAKOUT
    from clusterenv.learner.tools.presets import defaults_for

    slow = make_env(SLOW_MINATAR_BREAKOUT, {"delay_s": 0.01}, training=True)
    plain = make_env("MinAtar/Breakout-v1", {}, training=True)
    assert slow.observation_space == plain.observation_space
    t0 = time.perf_counter()
    slow_obs, slow_rewards = play(slow, seed=4, steps=20)
    assert time.perf_counter() - t0 >= 20 * 0.01
    plain_obs, plain_rewards = play(plain, seed=4, steps=20)
    np.testing.assert_array_equal(slow_obs, plain_obs)
    assert slow_rewards == plain_rewards
    slow_cfg, plain_cfg = (
        defaults_for(e, "dqn", True) for e in (SLOW_MINATAR_BREAKOUT, "MinAtar/Breakout-v1")
    )
    assert (slow_cfg.agent, slow_cfg.total_steps) == (plain_cfg.agent, plain_cfg.total_steps)
