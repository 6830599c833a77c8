"""MinAtar's games as Gymnasium envs for a conv net: uint8 observations (C, 10, 10), seeded resets."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.envs.registration import EnvSpec

# The games under the names of minatar.gym.register_envs(): MinAtar/<Name>-v0 acts with all six
# actions, -v1 with the game's minimal action set (Breakout: 3).
GAMES = {
    "Asterix": "asterix",
    "Breakout": "breakout",
    "Freeway": "freeway",
    "Seaquest": "seaquest",
    "SpaceInvaders": "space_invaders",
}
VERSIONS = {"v0": False, "v1": True}  # minimal action set or not

# Frames for `rgb_array`: channel k (of up to 10, Seaquest's) drawn in colour k + 1 over black, each
# cell a 16×16 block (a 160×160 frame; MinAtar's own is 10×10 floats).
PALETTE = np.array(
    [[0, 0, 0], [31, 119, 180], [255, 127, 14], [44, 160, 44], [214, 39, 40], [148, 103, 189],
     [140, 86, 75], [227, 119, 194], [127, 127, 127], [188, 189, 34], [23, 190, 207]],
    dtype=np.uint8,
)  # fmt: skip
CELL = 16


class MinAtarEnv(gym.Env):
    """One MinAtar game. Its state (10, 10, C) of bools is observed channel-first as uint8 0/1.
    MinAtar draws everything (the game's randomness and its sticky actions) from one numpy
    RandomState; a reset with a seed reseeds it from this env's np_random, so `reset(seed=s)`
    replays the same episode for the same actions, whatever ran before. `sticky_action_prob`
    (MinAtar's default 0.1: the previous action repeats) and `difficulty_ramping` are
    MinAtar's own options."""

    metadata = {"render_modes": ["rgb_array"], "render_fps": 15}

    def __init__(
        self,
        game: str,
        minimal_action_set: bool = True,
        sticky_action_prob: float = 0.1,
        difficulty_ramping: bool = True,
        render_mode: str | None = None,
    ):
        from minatar import Environment

        self.game = Environment(
            game, sticky_action_prob=sticky_action_prob, difficulty_ramping=difficulty_ramping
        )
        self.render_mode = render_mode
        all_actions = list(range(self.game.num_actions()))
        self.actions = self.game.minimal_action_set() if minimal_action_set else all_actions
        height, width, channels = self.game.state_shape()
        self.observation_space = gym.spaces.Box(0, 1, (channels, height, width), np.uint8)
        self.action_space = gym.spaces.Discrete(len(self.actions))
        self._seeded = False

    def _obs(self) -> np.ndarray:
        return np.ascontiguousarray(self.game.state().transpose(2, 0, 1), dtype=np.uint8)

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        super().reset(seed=seed)
        if seed is not None or not self._seeded:
            # Environment.seed gives the game the same RandomState its sticky actions draw from.
            self.game.seed(int(self.np_random.integers(2**32)))
            self._seeded = True
        # Sticky actions repeat the last action, which MinAtar keeps across its resets: without
        # this, an episode's first step would depend on how the previous episode ended.
        self.game.last_action = 0
        self.game.reset()
        return self._obs(), {}

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        reward, done = self.game.act(self.actions[int(action)])
        return self._obs(), float(reward), bool(done), False, {}

    def render(self) -> np.ndarray | None:
        if self.render_mode != "rgb_array":
            return None
        state = self.game.state()
        # The highest set channel of each cell picks its colour (as MinAtar's own display).
        colour = np.max(state * np.arange(1, state.shape[2] + 1), axis=2)
        return PALETTE[colour].repeat(CELL, axis=0).repeat(CELL, axis=1)


def make(
    env_id: str, env_kwargs: dict[str, Any], *, training: bool, render_mode: str | None
) -> gym.Env:
    """`MinAtar/<Game>-v0|v1` through gym.make (so it has a spec, the env checker and any
    `max_episode_steps` given); the same in training and evaluation: MinAtar's rewards are
    already small and it has no lives."""
    name, _, version = env_id.removeprefix("MinAtar/").rpartition("-")
    if name not in GAMES or version not in VERSIONS:
        known = ", ".join(f"MinAtar/{g}-{v}" for g in GAMES for v in VERSIONS)
        raise gym.error.UnregisteredEnv(f"{env_id} is not a MinAtar game: {known}")
    spec = EnvSpec(
        id=env_id,
        entry_point="clusterenv.pipeline.envs.minatar:MinAtarEnv",
        kwargs={"game": GAMES[name], "minimal_action_set": VERSIONS[version]},
    )
    render = {} if render_mode is None else {"render_mode": render_mode}
    return gym.make(spec, **env_kwargs, **render)
