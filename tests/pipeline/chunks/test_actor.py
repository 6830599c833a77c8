"""The Actor on a local SyncVectorEnv (no server): valid transitions, episodes across chunks."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest

from clusterenv.pipeline.chunks.actor import Actor, env_seeds, make_vector_env


class Countdown(gym.Env):
    """Episodes of exactly `length` steps; observes [steps since reset]; reward at step t is t."""

    observation_space = gym.spaces.Box(0.0, np.inf, shape=(1,), dtype=np.float32)
    action_space = gym.spaces.Discrete(2)

    def __init__(self, length: int):
        self.length, self.t = length, 0

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        self.t = 0
        return np.array([0.0], np.float32), {}

    def step(self, action):
        self.t += 1
        obs = np.array([float(self.t)], np.float32)
        return obs, float(self.t), self.t >= self.length, False, {}


def countdowns(*lengths: int) -> gym.vector.SyncVectorEnv:
    return gym.vector.SyncVectorEnv(
        [lambda n=n: Countdown(n) for n in lengths],
        autoreset_mode=gym.vector.AutoresetMode.NEXT_STEP,
    )


def by_env(arrays: dict[str, np.ndarray], name: str, env: int) -> list:
    return arrays[name][arrays["env_index"] == env].tolist()


def act_by_parity(obs: np.ndarray) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    return (obs[:, 0].astype(np.int64)) % 2, {}


def test_reset_steps_are_dropped_and_columns_line_up():
    # Env 0 ends every 3 steps, env 1 every 4. In 5 vector steps env 0 steps 1-3 (done), resets
    # at 4 and steps at 5; env 1 steps 1-4 (done) and resets at 5: 4 transitions each, not 5.
    actor = Actor(countdowns(3, 4), seeds=[0, 1])
    chunk = actor.collect(act_by_parity, steps=5)
    a = chunk.arrays
    assert chunk.env_steps == 10
    assert {k: len(v) for k, v in a.items()} == dict.fromkeys(a, 8)
    assert a["env_index"].dtype == np.int32
    assert by_env(a, "obs", 0) == [[0.0], [1.0], [2.0], [0.0]]
    assert by_env(a, "obs", 1) == [[0.0], [1.0], [2.0], [3.0]]
    assert by_env(a, "terminated", 0) == [False, False, True, False]
    assert by_env(a, "terminated", 1) == [False, False, False, True]
    # Every kept transition is a real step: next_obs follows obs (never a reset observation).
    assert np.array_equal(a["next_obs"], a["obs"] + 1)
    assert np.array_equal(a["reward"], a["next_obs"][:, 0])
    assert np.array_equal(a["action"], act_by_parity(a["obs"])[0])
    assert not a["truncated"].any()


def test_episodes_continue_across_collect_calls():
    actor = Actor(countdowns(3, 4), seeds=[0, 1])
    first = actor.collect(act_by_parity, steps=5)
    second = actor.collect(act_by_parity, steps=5)
    # Env 0's second episode starts in the first chunk (step 5) and ends in the second (step 7).
    assert by_env(second.arrays, "obs", 0) == [[1.0], [2.0], [0.0], [1.0]]
    assert by_env(second.arrays, "terminated", 0) == [False, True, False, False]
    # Env 1 ended at step 4; its reset step (5) was the first chunk's last: the second chunk
    # starts its next episode and ends it at step 9, then resets at 10.
    assert by_env(second.arrays, "obs", 1) == [[0.0], [1.0], [2.0], [3.0]]
    assert len(second.arrays["action"]) == 8
    # Returns and lengths are whole episodes, counted across the chunk boundary.
    assert first.episodes == [(6.0, 3), (10.0, 4)]
    assert second.episodes == [(6.0, 3), (10.0, 4)]


def test_episode_return_counts_every_step_once():
    actor = Actor(countdowns(5), seeds=[0])
    episodes = []
    for _ in range(6):  # 18 steps, chunks of 3: episodes cut at every possible point
        episodes += actor.collect(act_by_parity, steps=3).episodes
    # Episodes take 6 vector steps (5 steps + the reset step): done at steps 5, 11 and 17.
    assert episodes == [(15.0, 5)] * 3


def test_actions_are_the_act_functions_for_the_observation_it_was_given():
    seen: list[np.ndarray] = []

    def act(obs: np.ndarray) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        seen.append(obs.copy())
        return np.array([1, 0], np.int64), {}

    actor = Actor(countdowns(10, 10), seeds=[0, 1])
    chunk = actor.collect(act, steps=4)
    assert len(seen) == 4
    np.testing.assert_array_equal(np.concatenate(seen), chunk.arrays["obs"])
    assert chunk.arrays["action"].tolist() == [1, 0] * 4
    assert chunk.arrays["env_index"].tolist() == [0, 1] * 4  # time-major, then env


def lean(obs: np.ndarray) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    return (obs[:, 2] > 0).astype(np.int64), {}


def test_cartpole_through_make_vector_env_is_seeded_and_truncates():
    kwargs = {"max_episode_steps": 6}
    seeds = env_seeds(5, actor_index=2, num_envs=3)
    assert seeds == [5 * 1_000_003 + 6 + i for i in range(3)]
    a = Actor(make_vector_env("CartPole-v1", kwargs, 3, training=True), seeds).collect(lean, 14)
    b = Actor(make_vector_env("CartPole-v1", kwargs, 3, training=True), seeds).collect(lean, 14)
    for name in a.arrays:
        np.testing.assert_array_equal(a.arrays[name], b.arrays[name])
    local = gym.make("CartPole-v1", **kwargs)
    first_obs, _ = local.reset(seed=seeds[1])
    np.testing.assert_array_equal(by_env(a.arrays, "obs", 1)[0], first_obs)
    assert a.arrays["truncated"].any()
    assert all(length <= 6 for _, length in a.episodes)


@pytest.mark.parametrize("steps", [1, 7])
def test_env_steps_count_every_vector_step(steps):
    chunk = Actor(countdowns(2, 3, 4), seeds=[0, 1, 2]).collect(act_by_parity, steps)
    assert chunk.env_steps == 3 * steps
