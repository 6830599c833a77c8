"""Atari games through ale-py with the DQN wrapper stack: uint8 (4, 84, 84) observations; in
training a lost life ends the episode and rewards are sign-clipped, in evaluation neither."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np

FRAME_SKIP, SCREEN, STACK, NOOP_MAX = 4, 84, 4, 30


class EpisodicLife(gym.Wrapper):
    """A lost life ends the episode (terminated) but not the game: the reset after it goes on
    with one no-op step, as DeepMind's DQN and SB3's EpisodicLifeEnv do. Gymnasium's
    AtariPreprocessing(terminal_on_life_loss=True) ends the episode the same way, but its next
    reset restarts the game, so collection would only ever see each game's first life."""

    def __init__(self, env: gym.Env):
        super().__init__(env)
        self.lives = 0
        self.game_over = True

    def step(self, action: Any) -> tuple[Any, Any, bool, bool, dict[str, Any]]:
        obs, reward, terminated, truncated, info = self.env.step(action)
        self.game_over = bool(terminated or truncated)
        lives = self.env.unwrapped.ale.lives()
        terminated = terminated or 0 < lives < self.lives
        self.lives = lives
        return obs, reward, terminated, truncated, info

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Any, dict[str, Any]]:
        if self.game_over or seed is not None or options is not None:
            obs, info = self.env.reset(seed=seed, options=options)
        else:
            obs, _, terminated, truncated, info = self.env.step(0)
            if terminated or truncated:  # the no-op lost the last life
                obs, info = self.env.reset()
        self.lives, self.game_over = self.env.unwrapped.ale.lives(), False
        return obs, info


def make(
    env_id: str, env_kwargs: dict[str, Any], *, training: bool, render_mode: str | None
) -> gym.Env:
    """`ALE/<Game>-v5` (or another ALE id) under AtariPreprocessing: up to 30 no-ops at reset,
    4 frames per step with the last two max-pooled, 84×84 grayscale; then in training only
    EpisodicLife and rewards clipped to their sign; then the last 4 frames stacked. The env
    keeps the v5 defaults but frameskip (sticky actions: repeat_action_probability 0.25, the
    minimal action set, 108,000 frames at most), any of which `env_kwargs` may override."""
    import ale_py

    gym.register_envs(ale_py)
    if "frameskip" in env_kwargs:
        raise TypeError(f"frameskip: the wrappers skip {FRAME_SKIP} frames, the env none")
    render = {} if render_mode is None else {"render_mode": render_mode}
    env = gym.make(env_id, frameskip=1, **env_kwargs, **render)
    env = gym.wrappers.AtariPreprocessing(
        env,
        noop_max=NOOP_MAX,
        frame_skip=FRAME_SKIP,
        screen_size=SCREEN,
        terminal_on_life_loss=False,  # EpisodicLife's, in training
        grayscale_obs=True,
        scale_obs=False,  # uint8 stays uint8
    )
    if training:
        env = EpisodicLife(env)
        env = gym.wrappers.TransformReward(env, lambda r: float(np.sign(r)))
    env = gym.wrappers.FrameStackObservation(env, STACK)
    # One step is FRAME_SKIP of the console's 60 frames a second (ALE says 30): videos in time.
    env.metadata = {**env.metadata, "render_fps": 60 // FRAME_SKIP}
    return env
